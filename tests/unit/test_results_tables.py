"""RESULTS.md's tables come from committed data files through a command: every marked table is
rendered again from its data file by ``benchmarks/results.py`` and compared with what RESULTS.md
shows; the planner's data file is also compared with what the planner says now."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import plan_table  # noqa: E402
import results  # noqa: E402

FIX = "regenerate them: .venv/bin/python benchmarks/results.py --write (after rerunning the benchmark whose data changed)"


def test_every_marked_table_of_results_md_is_what_its_data_file_renders():
    text = results.RESULTS.read_text()
    names = {table.name for table in results.tables(text)}
    assert {"plan-table", "guard-cost", "diloco-stability", "convergence", "gpu-plan", "db-year"} <= names <= set(results.RENDERERS)
    assert results.differences(text) == [], FIX


def test_the_check_fails_when_a_number_in_a_table_is_altered(tmp_path):
    text = results.RESULTS.read_text()
    table = next(table for table in results.tables(text) if table.name == "guard-cost")
    section = text[text.rindex("<!--", 0, table.start):text.index("-->", table.end) + 3]
    assert results.differences(section) == []
    altered = section.replace("| 824,832 |", "| 824,833 |")
    assert altered != section
    found = results.differences(altered)
    assert len(found) == 1 and found[0].startswith("guard-cost from guard_cost_runs.jsonl: 1 line(s) differ"), found
    # the command exits 1 and says which table
    (tmp_path / "RESULTS.md").write_text(altered)
    check = subprocess.run([sys.executable, str(REPO / "benchmarks" / "results.py"), "--check", "--file", str(tmp_path / "RESULTS.md")],
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 1 and "guard-cost from guard_cost_runs.jsonl" in check.stdout, check.stdout + check.stderr
    # --write puts the data file's numbers back
    assert results.rewrite(altered) == section


def test_the_planner_data_file_is_what_the_planner_says_now():
    data = json.loads((REPO / "benchmarks" / "plan_table.json").read_text())
    assert data["rows"] == plan_table.plan_rows(), (
        "the planner changed: .venv/bin/python benchmarks/plan_table.py --write benchmarks/plan_table.json, "
        "then .venv/bin/python benchmarks/results.py --write")
