"""`p2ptrain doctor`, run as a user runs it: the CLI in a subprocess."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys

import psutil
import pytest


def run_doctor(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "p2ptrain.cli", "doctor", *arguments], capture_output=True,
                          text=True, timeout=60)


@pytest.mark.timeout(120)
def test_doctor_json_on_a_machine_without_a_gpu(tmp_path):
    result = run_doctor("--json", "--home", str(tmp_path))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["hardware"]["gpus"] == [] and report["hardware"]["cpu"]["cores_logical"] >= 1
    plan = report["plan"]
    assert plan["device"] == "cpu" and plan["precision"] == "fp32" and plan["quantization"] == "none"
    assert plan["micro_batch"] >= 1 and len(plan["rationale"]) >= 3
    names = {item["name"] for item in report["checks"]}
    assert {"nvml", "cuda", "bitsandbytes", "device-groups", "dht-port", "clock"} <= names
    for item in report["checks"]:
        assert set(item) == {"name", "ok", "level", "message", "fix"}
        assert item["ok"] or item["fix"], f"failed check {item['name']} has no fix"
    nvml = next(item for item in report["checks"] if item["name"] == "nvml")
    assert nvml["ok"] and "CPU" in nvml["message"]


@pytest.mark.timeout(120)
def test_doctor_reads_the_dht_port_and_the_policy_from_the_config(tmp_path):
    holder = socket.socket()
    holder.bind(("0.0.0.0", 0))
    holder.listen()
    port = holder.getsockname()[1]
    (tmp_path / "config.toml").write_text(
        f'[dht]\nhost_maddrs = ["/ip4/0.0.0.0/tcp/{port}"]\n[policy]\nmax_cpu_threads = 1\n')
    try:
        report = json.loads(run_doctor("--json", "--home", str(tmp_path)).stdout)
    finally:
        holder.close()
    dht = next(item for item in report["checks"] if item["name"] == "dht-port")
    assert dht["level"] == "warning"
    assert f"TCP port {port} is taken by {psutil.Process().name()} (pid {os.getpid()})" in dht["message"]
    assert re.search(r"the daemon will listen on port \d+ instead", dht["message"])  # the next free one
    assert "p2ptrain config set dht.host_maddrs" in dht["fix"]
    assert report["plan"]["cpu_threads"] == 1


@pytest.mark.timeout(120)
def test_doctor_text_report_and_a_model_that_does_not_fit(tmp_path):
    result = run_doctor("--home", str(tmp_path), "--model", "open-llama-13b")
    assert result.returncode == 0, result.stderr
    assert "plan on cpu: open-llama-13b does not fit" in result.stdout
    assert "[info] nvml: no NVIDIA GPU" in result.stdout


@pytest.mark.timeout(120)
def test_doctor_never_imports_torch_without_a_gpu():
    code = ("import sys; from p2ptrain.daemon.doctor import diagnose; diagnose(None, 'tiny'); "
            "print(sorted(m for m in ('torch', 'hivemind', 'transformers') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "[]", result.stderr
