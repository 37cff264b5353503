"""A real worker whose plan says a small micro-batch confirms it with real passes before its first step and
grows it while larger ones fit and train faster (the step keeps its samples)."""

from __future__ import annotations

import pytest
from test_worker_swarm import WorkerHandle, run_manifest, stop_all

from p2ptrain.worker_pipe import WorkerPlan

pytestmark = pytest.mark.swarm


@pytest.mark.timeout(240)
def test_a_worker_planned_at_micro_batch_2_calibrates_up_to_a_faster_one(tmp_path):
    # 8 tokens a sample: a pass of 2 samples of the tiny model is mostly fixed cost
    manifest = run_manifest("grow", seq_len=8, micro_batch_hint=16)
    worker = WorkerHandle(tmp_path, "small-plan", manifest, True, [],
                          plan=WorkerPlan(device="cpu", micro_batch=2, grad_accum=8, cpu_threads=1))
    try:
        joined = worker.joined()
        [calibrated] = worker.events("calibrated")
        assert calibrated["data"]["planned_micro_batch"] == 2
        assert joined["micro_batch"] == calibrated["data"]["micro_batch"] >= 8, calibrated["data"]["speeds"]
        assert joined["micro_batch"] * joined["grad_accum"] == 16
        assert "grown from the plan's 2" in calibrated["message"]
        worker.wait_for(lambda w: w.of_type("step"), 60, "a training step at the grown micro-batch")
    finally:
        stop_all([worker])
