"""DiLoCo's defaults train without diverging: a lone peer and three, the built-in model and LoRA.

On a GPU a lone creator's DiLoCo run with the defaults of the time (the paper's outer lr
0.7 and Nesterov momentum 0.9) diverged to non-finite gradients. Here real workers train
with every learning rate left to the manifest's defaults (``peers/swarm/outer_step.py``): a peer
alone (every run starts so), and three peers averaging, on the tiny preset from random
weights and on LoRA adapters over a small saved Llama in bf16 where this CPU computes it
natively. No batch may be non-finite, no guard may roll back, and the validation loss falls.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from local_models import save_small_corpus, save_small_llama  # noqa: E402
from test_worker_swarm import WorkerHandle, rounds_with_others, run_manifest, start_swarm, stop_all  # noqa: E402

from p2ptrain.peers.swarm.outer_step import stability_warning  # noqa: E402
from p2ptrain.worker_pipe import WorkerPlan  # noqa: E402

pytestmark = pytest.mark.swarm

LEARNING_RATES = ("inner_lr", "outer_lr", "outer_momentum")


def native_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX-512 BF16 or AMX): elsewhere it is emulated, slowly."""
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return "avx512_bf16" in flags or "amx_bf16" in flags


def defaults_manifest(run_id: str, model: str, tmp_path: Path) -> tuple[dict, WorkerPlan]:
    """A DiLoCo run with the learning rates left out (the manifest's defaults), and the workers' plan."""
    manifest = {key: value for key, value in run_manifest(run_id, mode="diloco", target_batch_size=96).items()
                if key not in LEARNING_RATES and key != "local_steps"}
    if model == "tiny":
        return manifest, WorkerPlan(device="cpu", micro_batch=4, cpu_threads=1)
    save_small_llama(tmp_path / "small-llama")
    save_small_corpus(tmp_path / "corpus.txt")
    manifest.update(model=str(tmp_path / "small-llama"), lora={"r": 8}, seq_len=64,
                    dataset={"kind": "files", "paths": [str(tmp_path / "corpus.txt")]})
    return manifest, WorkerPlan(device="cpu", micro_batch=4, cpu_threads=1, precision="bf16" if native_bf16() else "fp32")


def assert_trained_sanely(worker: WorkerHandle, epochs: int, start: float | None = None) -> None:
    """No non-finite batch, no rollback, and after ``epochs`` epochs a validation loss below ``start``
    (the run's first: its creator's first epoch's, by default this worker's)."""
    worker.drain()
    assert worker.events("non-finite") == [] and worker.events("diverged") == []
    validation = [report["val_loss"] for report in worker.of_type("epoch")]
    assert len(validation) >= epochs and validation[-1] < (validation[0] if start is None else start), (start, validation)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("model", ["tiny", "lora"])
def test_a_lone_peer_trains_with_the_defaults(tmp_path, model):
    manifest, plan = defaults_manifest(f"lone-{model}", model, tmp_path)
    worker = WorkerHandle(tmp_path, "alone", manifest, True, [], plan=plan)
    try:
        joined = worker.joined()
        # the defaults are in the range the DiLoCo study found stable for a lone peer and short rounds
        assert stability_warning("diloco", joined["manifest"]["outer_lr"], joined["manifest"]["outer_momentum"]) is None
        assert joined["precision"] == plan.precision
        worker.wait_for(lambda w: len(w.of_type("epoch")) >= 6, 200, "six outer steps alone")
        assert_trained_sanely(worker, 6)
    finally:
        stop_all([worker])


@pytest.mark.timeout(420)
@pytest.mark.parametrize("model", ["tiny", "lora"])
def test_three_peers_train_together_with_the_defaults(tmp_path, model):
    manifest, plan = defaults_manifest(f"three-{model}", model, tmp_path)
    workers = start_swarm(tmp_path, manifest, 3, plan=plan)
    try:
        for worker in workers:
            worker.wait_for(lambda w: rounds_with_others(w) >= 4, 300, "four rounds averaged with the others")
        # a joiner that averaged into rounds the others had begun downloads their state instead of
        # taking the outer step itself: it may have reported one epoch, measured against the run's start
        start = workers[0].of_type("epoch")[0]["val_loss"]
        for worker in workers:
            assert_trained_sanely(worker, 1, start)
    finally:
        stop_all(workers)
