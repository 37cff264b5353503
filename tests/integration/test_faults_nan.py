"""A peer that sends NaN in averaging rounds poisons no one.

Two honest training workers (started as the daemon starts them, see
test_worker_swarm.py) train a run on 127.0.0.1. A rogue peer -- its own
process, a p2ptrain DHT node and a plain hivemind ``DecentralizedAverager``
under the run's averaging prefix with tensors of the same shapes, all NaN --
joins their averaging rounds over the network. Every honest peer in such a
round receives a non-finite average; it must not adopt it, and go on training.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from p2ptrain.peers.checkpoint import checkpoint_path, load_checkpoint
from p2ptrain.peers.diloco import PseudoGradientAverager
from p2ptrain.peers.sync import CheckedTrainingStateAverager, CountingGradientAverager
from p2ptrain.peers.manifest import averaging_prefix, parse_manifest
from test_worker_swarm import WorkerHandle, run_manifest, stop_all

pytestmark = [pytest.mark.swarm]

# The rogue: joins every round it can under each prefix, with NaN tensors shaped
# like the run's trainable parameters; prints one JSON line per finished round.
ROGUE = r"""
import json, sys, threading, time
import torch
from hivemind.averaging import DecentralizedAverager
from p2ptrain.peers.dht import start_dht
from p2ptrain.peers.models import build_model

torch.set_num_threads(1)
config = json.loads(sys.argv[1])
shapes = [tuple(p.shape) for p in build_model(config["model"], seed=config["seed"]).trainable()]
dht = start_dht(config["initial_peers"], config["identity"], host_maddrs=["/ip4/127.0.0.1/tcp/0"], use_relay=False)

def poison(averager, prefix):
    while True:
        with averager.get_tensors() as tensors:
            for tensor in tensors:
                tensor.fill_(float("nan"))
        try:
            group = averager.step(weight=1.0, timeout=10.0)
        except Exception:
            group = None
        if group:
            print(json.dumps({"prefix": prefix, "group": len(group), "time": time.time()}), flush=True)

for prefix, class_name, requires_grad in config["prefixes"]:
    # hivemind names its RPC handlers after the averager's class, and groups form only among
    # averagers whose tensors match in shape, dtype and requires_grad; it starts an averager
    # from the main thread only (it sets a signal handler)
    averager = type(class_name, (DecentralizedAverager,), {})(
        averaged_tensors=[torch.full(shape, float("nan")).requires_grad_(requires_grad) for shape in shapes], dht=dht, prefix=prefix,
        min_matchmaking_time=3.0, request_timeout=1.5, allreduce_timeout=20.0, start=True,
    )
    threading.Thread(target=poison, args=(averager, prefix), daemon=True).start()
    print(json.dumps({"prefix": prefix, "schema": averager.schema_hash.hex()}), flush=True)
print(json.dumps({"ready": True}), flush=True)
while True:
    time.sleep(1)
"""


class Rogue:
    """The rogue peer's process (its own session, so it ends with everything it started)."""

    def __init__(self, tmp_path: Path, manifest: dict, prefixes: list[tuple[str, str, bool]], initial_peer: str):
        """``prefixes``: (averaging prefix, the honest averager's class name, whether its tensors
        require grad) for each averager to poison."""
        config = {"model": manifest["model"], "seed": manifest["seed"], "identity": str(tmp_path / "rogue.key"),
                  "prefixes": prefixes, "initial_peers": [initial_peer]}
        environment = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
        self.output = open(tmp_path / "rogue.jsonl", "w")
        self.log = open(tmp_path / "rogue.log", "w")
        self.process = subprocess.Popen([sys.executable, "-c", ROGUE, json.dumps(config)], stdout=self.output,
                                        stderr=self.log, env=environment, start_new_session=True)

    def rounds(self) -> list[dict]:
        """Rounds the rogue finished with at least one other peer."""
        # read through a path of its own: the rogue's stdout shares the offset of self.output
        written = Path(self.output.name).read_text()
        complete = written[: written.rfind("\n") + 1]
        lines = [json.loads(line) for line in complete.splitlines() if line.strip()]
        return [line for line in lines if line.get("group", 0) >= 2]

    def wait_for_rounds(self, count: int, timeout: float, workers: list[WorkerHandle]) -> list[dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"the rogue exited with {self.process.returncode}"
            for worker in workers:
                worker.drain(0.2)
            if len(self.rounds()) >= count:
                return self.rounds()
        honest = {worker.spec["nickname"]: (worker.epoch(), [event["data"]["peers"] for event in worker.events("averaged")][-20:],
                                            len(worker.events("state-downloaded"))) for worker in workers}
        raise AssertionError(f"the rogue joined {len(self.rounds())} rounds with honest peers in {timeout} s, not {count}; "
                             f"honest (epoch, last group sizes, downloads): {honest}; see {self.log.name}")

    def kill(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(10)
        for stream in (self.output, self.log):
            stream.close()


def assert_all_finite(worker: WorkerHandle) -> None:
    losses = [report["loss"] for report in worker.of_type("step") + worker.of_type("epoch") if report.get("loss") is not None]
    validation = [report["val_loss"] for report in worker.of_type("epoch")]
    assert losses and validation
    assert all(math.isfinite(value) for value in losses + validation), f"{worker.spec['nickname']} adopted NaN: {losses} {validation}"


def start_honest_peers(tmp_path: Path, manifest: dict, workers: list[WorkerHandle]) -> str:
    """Start two workers into ``workers`` (so the caller ends them whatever happens); the creator's address."""
    workers.append(WorkerHandle(tmp_path, "peer0", manifest, True, []))
    workers[0].wait_for(lambda w: w.of_type("joined"), 300, "peer0 to join")
    address = workers[0].of_type("joined")[0]["addresses"][0]
    workers.append(WorkerHandle(tmp_path, "peer1", manifest, False, [address]))
    workers[1].wait_for(lambda w: w.of_type("joined"), 300, "peer1 to join")
    return address


def leave_and_read_checkpoints(workers: list[WorkerHandle], run_id: str) -> list[dict]:
    for worker in workers:
        worker.send("leave")
    states = []
    for worker in workers:
        worker.wait_for(lambda w: w.of_type("left"), 120, "left")
        states.append(load_checkpoint(checkpoint_path(worker.spec["paths"]["checkpoints_dir"], run_id)))
    return states


def assert_finite_tensors(tensors, what: str) -> None:
    tensors = list(tensors)
    assert tensors and all(bool(tensor.isfinite().all()) for tensor in tensors), f"{what} holds NaN or infinity"


def poisoned_and_trained_on(tmp_path: Path, manifest: dict, prefixes: list[tuple[str, str, bool]], workers: list[WorkerHandle]):
    """The honest peers start, the rogue gets into one of their rounds (its rounds form when the timing lets it
    lead or join, not every epoch), and each honest peer trains two more epochs with finite losses. Returns the
    rogue (the caller kills it)."""
    address = start_honest_peers(tmp_path, manifest, workers)
    assert workers[0].of_type("joined")[0]["manifest_hash"] in prefixes[0][0]
    rogue = Rogue(tmp_path, manifest, prefixes, address)
    try:
        rogue.wait_for_rounds(1, 240, workers)
        poisoned_at = {id(worker): worker.epoch() for worker in workers}
        for worker in workers:
            # training goes on past the poisoned rounds, the rogue still there
            worker.wait_for(lambda w: w.epoch() >= poisoned_at[id(w)] + 2, 180, "two more epochs")
            assert_all_finite(worker)
    except BaseException:
        rogue.kill()
        raise
    return rogue


@pytest.mark.timeout(600)
def test_a_peer_that_averages_nan_poisons_nobody_in_diloco(tmp_path, capfd):
    manifest = run_manifest("nan-diloco", mode="diloco", local_steps=8, target_batch_size=64, inner_lr=2e-3)
    prefix = f"{averaging_prefix(parse_manifest(manifest))}_diloco"
    workers: list[WorkerHandle] = []
    try:
        rogue = poisoned_and_trained_on(tmp_path, manifest, [(prefix, PseudoGradientAverager.__name__, False)], workers)
        rogue.kill()
        for worker, state in zip(workers, leave_and_read_checkpoints(workers, manifest["run_id"])):
            assert_finite_tensors(list(state["trainable"].values()) + state["trainer"]["global_parameters"]
                                  + state["trainer"]["outer_momentum"], f"{worker.spec['nickname']}'s checkpoint")
        # an honest peer said it refused a poisoned average: an event, and a warning in its log (stderr)
        assert any(worker.events("non-finite-average") for worker in workers)
        assert "non-finite pseudo-gradients: not adopted" in capfd.readouterr().err
    finally:
        stop_all(workers)


@pytest.mark.timeout(600)
def test_a_peer_that_averages_nan_poisons_nobody_in_sync_mode(tmp_path, capfd):
    manifest = run_manifest("nan-sync", target_batch_size=128)
    prefix = averaging_prefix(parse_manifest(manifest))
    # hivemind.Optimizer averages gradients, then parameters (which require grad), each epoch
    # hivemind names an averager's RPC handlers after its class: the rogue's must be named as ours
    prefixes = [(f"{prefix}_grad_averager", CountingGradientAverager.__name__, False),
                (f"{prefix}_state_averager", CheckedTrainingStateAverager.__name__, True)]
    workers: list[WorkerHandle] = []
    try:
        rogue = poisoned_and_trained_on(tmp_path, manifest, prefixes, workers)
        rogue.kill()
        for worker, state in zip(workers, leave_and_read_checkpoints(workers, manifest["run_id"])):
            assert_finite_tensors(state["trainable"].values(), f"{worker.spec['nickname']}'s checkpoint")
        assert any(worker.events("non-finite-average") for worker in workers)
        logged = capfd.readouterr().err
        assert "averaging gave non-finite" in logged and "not adopted" in logged
    finally:
        stop_all(workers)
