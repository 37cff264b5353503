"""Calibration: the worker confirms its micro-batch with real forward/backward passes before its first
step, halving it on a real out-of-memory error (the one back-off, shared with the daemon's restarts)
and growing it while a larger one fits the memory cap and trains faster, and records the measured
speeds in the plan cache that ``p2ptrain plan`` shows."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from p2ptrain.daemon.worker_slots import WorkerRestarts
from p2ptrain.worker_pipe import halved_micro_batch


def test_out_of_memory_halves_the_micro_batch_and_keeps_the_samples_per_step():
    assert halved_micro_batch(8, 2) == (4, 4)
    assert halved_micro_batch(64, 1) == (32, 2)
    assert halved_micro_batch(6, 1) == (3, 2)
    assert halved_micro_batch(5, 1) == (1, 5), "no divisor of 5 between 2 and 3: a step keeps its 5 samples"
    assert halved_micro_batch(1, 16) is None, "nothing smaller than one sample"


def test_a_restarted_worker_starts_at_half_what_it_ran_out_of_memory_at():
    restarts = WorkerRestarts()
    assert restarts.micro_batch_cap() is None
    restarts.out_of_memory_at = (8, 2)
    assert restarts.micro_batch_cap() == (4, 4)


@pytest.mark.timeout(240)
def test_calibration_measures_a_fitting_micro_batch_and_leaves_the_model_as_it_was(tmp_path):
    import torch

    from p2ptrain.peers.worker.calibration import Calibration, calibrate
    from p2ptrain.peers.model.models import build_model
    from p2ptrain.peers.worker.plan_cache import cache_key, read_plan_cache, record_measurement

    torch.set_num_threads(1)
    loaded = build_model("tiny", seed=3)
    before = [parameter.detach().clone() for parameter in loaded.model.parameters()]

    calibration = calibrate(loaded.model, "tiny", "cpu", micro_batch=4, grad_accum=2, seq_len=64)

    assert calibration.micro_batch in (4, 8) and calibration.micro_batch * calibration.grad_accum == 8
    assert calibration.out_of_memory_at == () and calibration.samples_per_second > 0
    assert all(parameter.grad is None for parameter in loaded.model.parameters())
    assert all(torch.equal(old, new) for old, new in zip(before, loaded.model.parameters()))

    key = cache_key("tiny", "Some CPU", "fp32", "none")
    record_measurement(tmp_path, key, calibration.to_cache(seq_len=64))
    record_measurement(tmp_path, cache_key("tiny", "Some GPU", "bf16", "none"), Calibration(8, 1, 99.0).to_cache(seq_len=64))
    cached = read_plan_cache(tmp_path)
    assert set(cached) == {key, "tiny|Some GPU|bf16|none"}
    assert cached[key]["samples_per_second"] == calibration.samples_per_second
    assert (cached[key]["micro_batch"], cached[key]["grad_accum"], cached[key]["seq_len"]) == (calibration.micro_batch, calibration.grad_accum, 64)
    assert set(cached[key]["speeds"]) >= {"4"}
    (tmp_path / "plans.json").write_text("{not json")
    assert read_plan_cache(tmp_path) == {}


@pytest.mark.timeout(240)
def test_calibration_grows_a_small_planned_micro_batch_while_it_fits_and_gets_faster(monkeypatch):
    import time

    import torch

    from p2ptrain.peers.worker import calibration
    from p2ptrain.peers.worker.calibration import GROWTH_GAIN, calibrate
    from p2ptrain.peers.model.models import build_model

    torch.set_num_threads(1)
    # the passes' CPU time, not the wall clock: on a machine busy with other work (a loaded CI runner) the
    # wall clock counts the time this thread waits for a core, and a size can look slower than it is
    monkeypatch.setattr(calibration.time, "perf_counter", time.thread_time)
    model = build_model("tiny", seed=3).model
    # 8 tokens a sample: a pass of 2 samples is mostly fixed cost, so 8 or 16 at once train much faster (each
    # doubling 25-80 % here, under load too)
    grown = calibrate(model, "tiny", "cpu", micro_batch=2, grad_accum=8, seq_len=8)

    assert grown.planned == 2 and grown.micro_batch >= 8, grown.speeds
    assert grown.micro_batch * grown.grad_accum == 16, "the step keeps its samples"
    kept = [size for size in sorted(grown.speeds) if size <= grown.micro_batch]
    assert all(grown.speeds[bigger] >= GROWTH_GAIN * grown.speeds[smaller] for smaller, bigger in zip(kept, kept[1:]))
    assert "grown from the plan's 2" in grown.words()

    capped = calibrate(model, "tiny", "cpu", micro_batch=2, grad_accum=8, seq_len=8, memory_cap_bytes=1)
    assert (capped.micro_batch, list(capped.speeds)) == (2, [2]), "a size whose peak would pass the cap is not tried"
    # after a training step ran out of memory at 8, the daemon allows 4: a calibration pass at 8 could
    # fit where training did not, and growing back to it would run out of memory again, round after round
    bounded = calibrate(model, "tiny", "cpu", micro_batch=2, grad_accum=8, seq_len=8, max_micro_batch=4)
    assert bounded.micro_batch <= 4 and max(bounded.speeds) <= 4, bounded.speeds


def test_growth_tries_divisors_of_the_step_about_twice_as_large():
    from p2ptrain.peers.worker.calibration import next_micro_batch

    assert [next_micro_batch(size, 64) for size in (1, 2, 8, 32, 64)] == [2, 4, 16, 64, None]
    assert next_micro_batch(4, 12) == 12 and next_micro_batch(3, 12) == 6 and next_micro_batch(5, 5) is None


CAPPED_CALIBRATION = """
import json, resource, sys
import psutil, torch, transformers, p2ptrain.peers.model.models  # loaded before the address space is capped
from p2ptrain.peers.worker.calibration import calibrate
from p2ptrain.peers.model.models import build_model
from p2ptrain.peers.worker.run_setup import WorkerFailure
torch.set_num_threads(1)
model = build_model("tiny").model
micro_batch, headroom_mib = int(sys.argv[1]), int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_AS, (psutil.Process().memory_info().vms + headroom_mib * 2**20, resource.RLIM_INFINITY))
try:
    result = calibrate(model, "tiny", "cpu", micro_batch=micro_batch, grad_accum=1, seq_len=256)
except WorkerFailure as failure:
    print(json.dumps({"failure": failure.message, "fix": failure.fix}))
else:
    print(json.dumps({"micro_batch": result.micro_batch, "grad_accum": result.grad_accum,
                      "out_of_memory_at": result.out_of_memory_at, "samples_per_second": result.samples_per_second}))
"""


def capped_calibration(micro_batch: int, headroom_mib: int) -> dict:
    """Calibrate the tiny model in a process whose address space is capped: the CPU allocator fails for real, as a full GPU would."""
    result = subprocess.run([sys.executable, "-c", CAPPED_CALIBRATION, str(micro_batch), str(headroom_mib)],
                            capture_output=True, text=True, timeout=280)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(300)
def test_calibration_halves_the_micro_batch_after_a_real_out_of_memory():
    # a pass of 32 x 256 tokens of the tiny model takes ~0.5 GiB, one of 8 about a quarter of that
    fitted = capped_calibration(32, headroom_mib=200)
    assert fitted["out_of_memory_at"][0] == 32
    assert fitted["out_of_memory_at"] == [32 // 2**halving for halving in range(len(fitted["out_of_memory_at"]))]
    assert fitted["micro_batch"] == 32 // 2 ** len(fitted["out_of_memory_at"]) >= 1
    assert fitted["micro_batch"] * fitted["grad_accum"] == 32
    assert fitted["samples_per_second"] > 0


@pytest.mark.timeout(300)
def test_calibration_gives_up_in_one_line_when_even_one_sample_does_not_fit():
    failed = capped_calibration(4, headroom_mib=1)
    assert "tiny runs out of memory on cpu even at micro-batch 1" in failed["failure"]
    assert "\n" not in failed["failure"] and "smaller model" in failed["fix"]


@pytest.mark.timeout(120)
def test_plan_shows_what_this_machines_worker_measured(tmp_path):
    from p2ptrain.daemon.hardware_probe import probe
    from p2ptrain.daemon.model_facts import model_facts
    from p2ptrain.daemon.plan import make_plan
    from p2ptrain.paths import resolve_paths
    from p2ptrain.peers.worker.calibration import Calibration
    from p2ptrain.peers.worker.plan_cache import cache_key, record_measurement

    device = next(device for device in probe().devices() if device.kind == "cpu")
    plan = make_plan(model_facts("tiny"), {"seq_len": 128, "micro_batch_hint": 8}, device)
    record_measurement(resolve_paths(tmp_path).cache_dir, cache_key("tiny", device.name, plan.precision, plan.quantization),
                       Calibration(plan.micro_batch, plan.grad_accum, 123.5).to_cache(seq_len=128))

    shown = subprocess.run([sys.executable, "-m", "p2ptrain.cli", "plan", "--model", "tiny", "--device", "cpu", "--json",
                            "--home", str(tmp_path)], capture_output=True, text=True, timeout=100)

    assert shown.returncode == 0, shown.stderr
    measured = json.loads(shown.stdout)
    assert measured["samples_per_second"] == 123.5 and measured["calibrated"]
    assert "measured here" in measured["rationale"][-1]
    elsewhere = subprocess.run([sys.executable, "-m", "p2ptrain.cli", "plan", "--model", "tiny", "--device", "cpu", "--json",
                                "--home", str(tmp_path / "elsewhere")], capture_output=True, text=True, timeout=100)
    assert json.loads(elsewhere.stdout)["samples_per_second"] is None
