"""The GPU planner benchmark runs end to end: here on the CPU with a tiny Llama shape (on a CUDA machine
it regenerates the measured table that tests/fixtures/gpu_h100_2026-11-26.jsonl holds)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_plan.py"


@pytest.mark.timeout(240)
def test_the_gpu_planner_benchmark_measures_estimates_and_reports(tmp_path):
    data = tmp_path / "gpu_plan.jsonl"
    ran = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--shape", str(REPO / "tests/fixtures/model-shapes/llama-tiny"),
                          "--seq-len", "32", "--max-micro-batch", "2", "--steps", "1", "--json", str(data)],
                         capture_output=True, text=True, timeout=220, cwd=REPO)
    assert ran.returncode == 0, ran.stderr[-3000:]
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    assert [row["kind"] for row in rows] == ["machine", "loaded", "step", "step", "plan"]
    steps = [row for row in rows if row["kind"] == "step"]
    assert [row["micro_batch"] for row in steps] == [1, 2] and all(row["samples_per_s"] > 0 for row in steps)
    assert steps[1]["estimate_gib"] > steps[0]["estimate_gib"] > 0
    assert rows[-1]["fastest_micro_batch"] in (1, 2) and rows[-1]["plan_quantization"] == "none"
    shown = subprocess.run([sys.executable, str(SCRIPT), "--report", str(data)], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert shown.returncode == 0 and "| llama-tiny | none | 2 x 32 |" in shown.stdout, shown.stdout + shown.stderr
