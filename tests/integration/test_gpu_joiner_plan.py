"""A volunteer with a GPU who joins a run created elsewhere gets a hardware plan, as the run's creator does.

The joiner's daemon sees a 16 GiB Turing card (compute capability 7.5) through
NVML, faked at its boundary (``fake_nvml``: this machine has no NVIDIA GPU).
It knows only the run's name and one address; its worker reads the manifest
from the swarm and asks the daemon for a plan, which is sized for the card:
fp16 (no bfloat16 before 8.0), not the fp32 defaults it trained with before.
This machine's torch has no CUDA, so the worker then stops with a one-line
error that says how to fix it, which is what a volunteer with the CPU build of
torch and a GPU would see.
"""

from __future__ import annotations

import json
import threading

import pytest

from daemons import cli
from fake_nvml import card, fake_nvml_environment
from p2ptrain.paths import resolve_paths
from p2ptrain.protocol import ControlClient

pytestmark = [pytest.mark.swarm]


def follow_statuses(home, until, timeout: float) -> list[dict]:
    """Every status the daemon at ``home`` pushes to a subscriber, until ``until(status)`` holds."""
    client = ControlClient(str(resolve_paths(home).socket), timeout=timeout)
    seen: list[dict] = []
    timer = threading.Timer(timeout, client.close)
    timer.start()
    try:
        for message in client.subscribe():
            if message["event"] in ("snapshot", "status"):
                seen.append(message["data"])
                if until(message["data"]):
                    break
    finally:
        timer.cancel()
        client.close()
    return seen


@pytest.mark.timeout(300)
def test_a_gpu_volunteer_joining_a_run_is_planned_for_its_card(daemons, short_tmp):
    creator = daemons.start("creator")
    created = cli(creator.home, "join", "--new-run", "gpu-joiner", "--mode", "sync", "--target-batch-size", "512",
                  "--micro-batch", "8")
    assert created.returncode == 0, created.stderr
    address = creator.wait_until(lambda s: (s.get("local") or {}).get("addresses"), 180, what="the run to start")["local"]["addresses"][0]

    turing = card("Tesla T4", total=16384, used=0, capability=(7, 5), fan=None)
    joiner = daemons.start("joiner", env=fake_nvml_environment(short_tmp / "nvml", [turing]))
    assert joiner.status()["hardware"]["gpus"][0]["name"] == "Tesla T4"
    done = {}

    def follow():
        done["statuses"] = follow_statuses(joiner.home, lambda s: s["state"] in ("error", "training"), timeout=200)

    follower = threading.Thread(target=follow)
    follower.start()
    joined = cli(joiner.home, "join", "gpu-joiner", "--peers", address)
    assert joined.returncode == 0, joined.stderr
    follower.join(220)
    statuses = done["statuses"]

    planned = [status["local"] for status in statuses if (status.get("local") or {}).get("plan")]
    assert planned, [status["state"] for status in statuses]
    local = planned[-1]
    assert (local["device"], local["precision"], local["quantization"], local["micro_batch"]) == ("cuda:0", "fp16", "none", 8)
    assert local["plan"]["rationale"][0] == "precision fp16: compute capability 7.5 has no bfloat16 (needs 8.0)"
    assert local["plan"]["memory_allowed_gib"] == pytest.approx(14.4) and local["plan"]["memory_cap_gib"] < 14.4
    assert local["workers"][0]["precision"] == "fp16"

    last = statuses[-1]
    assert last["state"] == "error", json.dumps(last)[:2000]
    error = last["health"][0]
    assert "the plan trains on the GPU Tesla T4, but torch here is a CPU-only build" in error["message"]
    assert "pip install torch" in error["fix"] and "training.device cpu" in error["fix"]
    recorded = json.loads(cli(joiner.home, "events", "--json").stdout)["events"]
    plan_events = [event["data"] for event in recorded if event["kind"] == "planned"]
    assert [(event["worker"], event["precision"], event["device_name"]) for event in plan_events] == [("gpu0", "fp16", "Tesla T4")]
