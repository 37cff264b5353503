"""A rogue peer cannot wreck a run: every attack of docs/bad-input.md's catalogue, in both modes.

Two honest training workers (started as the daemon starts them, see
test_worker_swarm.py) train a run on 127.0.0.1. A rogue -- its own process, a
p2ptrain DHT node and plain hivemind ``DecentralizedAverager``s under the run's
averaging prefixes, named and shaped like the honest ones -- joins their
averaging rounds over the network. It goes through the attacks one phase at a
time, each under a fresh peer id (a banned identity is useless to it, a new one
costs nothing):

- ``scaled-noise``: random values a thousand times an honest update, for as many
  rounds as it takes the honest peers to ban it; then it keeps trying, in vain;
- ``sign-flipped``: its own honest update (it trains the model itself) times -50;
- ``constant``: every value 1.0;
- ``stale``: the swarm's average from its first round (where it tagged along with
  weight 0), sent again round after round: as close to the swarm as an old
  average is, so only the replay gives it away;
- ``huge-weight``: an honest update claiming a billion samples;
- ``nan``: NaN.

For each phase: an honest peer names the phase's peer id in a ``suspect-peer``
event, and each honest peer's validation loss two epochs after the rogue's last
joined round of the phase is at most 1.10 x its value before the first. Both
honest peers ban the first identity, and it joins no round of theirs after that.
``benchmarks/rogue.py`` runs the same catalogue with longer phases beside a
clean control run, for RESULTS.md.
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

from p2ptrain.peers.training.diloco import PseudoGradientAverager
from p2ptrain.peers.swarm.manifest import averaging_prefix, parse_manifest
from p2ptrain.peers.training.sync import CheckedTrainingStateAverager, CountingGradientAverager
from p2ptrain.peers.robust.trust import REASON_WORDS
from test_worker_swarm import SHARED_CACHE, WorkerHandle, run_manifest, stop_all

pytestmark = [pytest.mark.swarm]

# The rogue: trains the model a little to have an honest update of each kind, then reads phases
# ({"attack": NAME}) from stdin; each phase gets a new identity and joins every round it can.
# Prints one JSON line per phase start and per finished round.
ROGUE = r"""
import json, sys, threading, time
from pathlib import Path
import torch
from hivemind.averaging import DecentralizedAverager
from p2ptrain.peers.model.data import train_batches
from p2ptrain.peers.net.dht import start_dht
from p2ptrain.peers.model.models import build_model, causal_lm_loss

torch.set_num_threads(1)
config = json.loads(sys.argv[1])
loaded = build_model(config["model"], seed=config["seed"])
parameters = loaded.trainable()
initial = [parameter.detach().clone() for parameter in parameters]
batches = train_batches({"kind": "stdlib"}, loaded.tokenizer, config["seq_len"], 4, 12345, Path(config["cache_dir"]))
causal_lm_loss(loaded.model, next(batches)).backward()
gradient = [parameter.grad.detach().clone() for parameter in parameters]
optimizer = torch.optim.AdamW(parameters, lr=config["inner_lr"])
for _ in range(config["local_steps"]):
    optimizer.zero_grad()
    causal_lm_loss(loaded.model, next(batches)).backward()
    optimizer.step()
honest = {"pseudo-gradient": [before - after.detach() for before, after in zip(initial, parameters)],
          "gradient": gradient, "parameters": initial}

def attack(name, kind, tensors, frozen):
    if name == "stale" and frozen:
        for tensor, update in zip(tensors, frozen):
            tensor.copy_(update)
        return 1.0 if kind == "parameters" else 32.0
    for tensor, update in zip(tensors, honest[kind]):
        if name == "scaled-noise":
            tensor.copy_(torch.randn_like(tensor) * 1000 * update.pow(2).mean().sqrt())
        elif name == "sign-flipped":
            tensor.copy_(-50 * update)
        elif name == "constant":
            tensor.fill_(1.0)
        elif name == "nan":
            tensor.fill_(float("nan"))
        else:  # huge-weight, and stale's first round: an honest-looking update
            tensor.copy_(update)
    if name == "huge-weight":
        return 1e9
    if name == "stale":
        return 0.0  # its first round: it tags along for the swarm's average, which it then replays
    return 1.0 if kind == "parameters" else 32.0

def join_rounds(phase, name, averager, prefix, kind, stop):
    frozen = []  # stale: the average of its first round, sent again every round after
    while not stop.is_set():
        with averager.get_tensors() as tensors:
            weight = attack(name, kind, tensors, frozen)
        try:
            group = averager.step(weight=weight, timeout=10.0)
        except Exception:
            group = None
        if group and len(group) >= 2:
            if not frozen:
                with averager.get_tensors() as tensors:
                    average = [tensor.detach().clone() for tensor in tensors]
                if all(torch.isfinite(tensor).all() for tensor in average) and any(tensor.any() for tensor in average):
                    frozen.extend(average)  # (a round of peers that all tagged along averages nothing)
            print(json.dumps({"phase": phase, "prefix": prefix, "group": len(group), "time": time.time()}), flush=True)

current = None
for phase, line in enumerate(sys.stdin):
    if current is not None:
        current["stop"].set()
        for thread in current["threads"]:
            thread.join(15)
        for averager in current["averagers"]:
            averager.shutdown()
        current["dht"].shutdown()
    name = json.loads(line)["attack"]
    if name == "stop":
        break
    dht = start_dht(config["initial_peers"], Path(config["identity_dir"]) / f"rogue-{phase}.key",
                    host_maddrs=["/ip4/127.0.0.1/tcp/0"], use_relay=False)
    current = {"dht": dht, "stop": threading.Event(), "threads": [], "averagers": []}
    for prefix, class_name, requires_grad, kind in config["prefixes"]:
        # hivemind names its RPC handlers after the averager's class, and groups form only among
        # averagers whose tensors match in shape, dtype and requires_grad; it starts an averager
        # from the main thread only (it sets a signal handler)
        averager = type(class_name, (DecentralizedAverager,), {})(
            averaged_tensors=[torch.zeros_like(tensor).requires_grad_(requires_grad) for tensor in initial], dht=dht,
            prefix=prefix, min_matchmaking_time=3.0, request_timeout=1.5, allreduce_timeout=20.0, start=True,
        )
        current["averagers"].append(averager)
        thread = threading.Thread(target=join_rounds, args=(phase, name, averager, prefix, kind, current["stop"]), daemon=True)
        current["threads"].append(thread)
        thread.start()
    print(json.dumps({"phase": phase, "attack": name, "peer_id": dht.peer_id.to_base58(), "started": time.time()}), flush=True)
"""

PHASES = ["scaled-noise", "sign-flipped", "constant", "stale", "huge-weight", "nan"]
EXPECTED_REASONS = {"stale": {"replayed"}, "huge-weight": {"implausible-weight"}}
REASONS = set(REASON_WORDS)


class Rogue:
    """The rogue's process (its own session, so it ends with everything it started); ``attack`` starts a phase."""

    def __init__(self, tmp_path: Path, manifest: dict, prefixes: list[tuple[str, str, bool, str]], initial_peer: str):
        """``prefixes``: (averaging prefix, the honest averager's class name, whether its tensors
        require grad, what it averages: pseudo-gradient, gradient or parameters) for each averager."""
        config = {"model": manifest["model"], "seed": manifest["seed"], "seq_len": manifest["seq_len"],
                  "inner_lr": manifest["inner_lr"], "local_steps": manifest["local_steps"], "cache_dir": str(SHARED_CACHE),
                  "identity_dir": str(tmp_path), "prefixes": prefixes, "initial_peers": [initial_peer]}
        environment = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
        self.output = open(tmp_path / "rogue.jsonl", "w")
        self.log = open(tmp_path / "rogue.log", "w")
        self.process = subprocess.Popen([sys.executable, "-c", ROGUE, json.dumps(config)], stdin=subprocess.PIPE, stdout=self.output,
                                        stderr=self.log, env=environment, start_new_session=True, text=True)

    def lines(self) -> list[dict]:
        # read through a path of its own: the rogue's stdout shares the offset of self.output
        written = Path(self.output.name).read_text()
        return [json.loads(line) for line in written[: written.rfind("\n") + 1].splitlines() if line.strip()]

    def attack(self, name: str, workers: list[WorkerHandle], timeout: float = 240) -> dict:
        """Start the next phase; returns its first line (``phase``, ``attack``, ``peer_id``)."""
        phase = len(self.phases())
        self.send(name)
        self.wait_until(lambda: len(self.phases()) > phase, timeout, workers, f"the rogue to start its {name} phase")
        return self.phases()[phase]

    def send(self, attack: str) -> None:
        """Tell the rogue to begin ``attack`` under a new identity (``stop``: end the phase and stay quiet)."""
        self.process.stdin.write(json.dumps({"attack": attack}) + "\n")
        self.process.stdin.flush()

    def phases(self) -> list[dict]:
        return [line for line in self.lines() if "attack" in line]

    def rounds(self, phase: int) -> list[dict]:
        """Rounds of ``phase`` that the rogue finished with at least one honest peer."""
        return [line for line in self.lines() if line.get("phase") == phase and "group" in line]

    def wait_until(self, condition, timeout: float, workers: list[WorkerHandle], what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"the rogue exited with {self.process.returncode}; see {self.log.name}"
            for worker in workers:
                worker.drain(0.2)
            if condition():
                return
        honest = {worker.spec["nickname"]: (worker.epoch(), [event["data"]["peers"] for event in worker.events("averaged")][-10:],
                                            [event["message"] for event in worker.events("suspect-peer")][-3:]) for worker in workers}
        raise AssertionError(f"timed out after {timeout} s waiting for {what}; honest (epoch, last group sizes, last suspects): "
                             f"{honest}; rogue lines {self.lines()[-5:]}; see {self.log.name}")

    def kill(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(10)
        for stream in (self.output, self.log, self.process.stdin):
            stream.close()


def reasons_named(workers: list[WorkerHandle], peer_id: str) -> set[str]:
    """Why the honest peers named ``peer_id`` in ``suspect-peer`` events."""
    return {event["data"]["reason"] for event in naming(workers, "suspect-peer", peer_id)}


def naming(workers: list[WorkerHandle], kind: str, peer_id: str) -> list[dict]:
    """The ``kind`` events (suspect-peer, peer-banned) of all honest peers that name ``peer_id``."""
    return [event for worker in workers for event in worker.events(kind) if event["data"]["peer_id"] == peer_id]


def assert_all_finite(worker: WorkerHandle) -> None:
    losses = [report["loss"] for report in worker.of_type("step") + worker.of_type("epoch") if report.get("loss") is not None]
    validation = [report["val_loss"] for report in worker.of_type("epoch")]
    assert losses and validation
    assert all(math.isfinite(value) for value in losses + validation), f"{worker.spec['nickname']} adopted NaN: {losses} {validation}"


def validation_loss_around(worker: WorkerHandle, first_round: float, last_round: float) -> tuple[dict, dict | None]:
    """The honest peer's last epoch report before ``first_round`` (a rogue's first joined round of a
    phase), and the report two epochs after the epoch of ``last_round`` (its last; None while it has
    not come yet; a peer that caught up by downloading reports no epochs in between: the first one
    from then on)."""
    epochs = worker.of_type("epoch")
    before = [report for report in epochs if report["ended_at"] < first_round][-1]
    attacked = [report for report in epochs if report["ended_at"] < last_round]
    after = [report for report in epochs if report["epoch"] >= max(before["epoch"], attacked[-1]["epoch"]) + 3]
    return before, after[0] if after else None


def start_honest_peers(tmp_path: Path, manifest: dict, workers: list[WorkerHandle]) -> str:
    """Start two workers into ``workers`` (so the caller ends them whatever happens); the creator's address."""
    workers.append(WorkerHandle(tmp_path, "peer0", manifest, True, []))
    workers[0].wait_for(lambda w: w.of_type("joined"), 300, "peer0 to join")
    address = workers[0].of_type("joined")[0]["addresses"][0]
    workers.append(WorkerHandle(tmp_path, "peer1", manifest, False, [address]))
    workers[1].wait_for(lambda w: w.of_type("joined"), 300, "peer1 to join")
    return address


def attack_catalogue(tmp_path: Path, manifest: dict, prefixes: list[tuple[str, str, bool, str]],
                     rounds_per_phase: int = 1) -> list[dict]:
    """Two honest peers and the rogue through ``PHASES``, each phase until the rogue is named (banned,
    for the noise) and has joined ``rounds_per_phase`` rounds with an honest peer (the noise: as many
    as the ban lets it). Checks the naming and the ban; returns one row per phase and honest peer:
    ``attack``, ``peer``, ``rounds`` (joined in the phase), ``reasons`` (why it was named), ``before``
    and ``after`` (``validation_loss_around``'s epochs and validation losses)."""
    workers: list[WorkerHandle] = []
    rogue = None
    try:
        address = start_honest_peers(tmp_path, manifest, workers)
        assert workers[0].of_type("joined")[0]["manifest_hash"] in prefixes[0][0]
        rogue = Rogue(tmp_path, manifest, prefixes, address)
        for worker in workers:
            worker.wait_for(lambda w: len(w.of_type("epoch")) >= 1, 240, "a first epoch (the loss before any attack)")
        phases = []
        for name in PHASES:
            phase = rogue.attack(name, workers)
            phases.append(phase)
            if name == "scaled-noise":
                # named in three rounds, banned by both honest peers; then refused
                rogue.wait_until(lambda: all(naming([worker], "peer-banned", phase["peer_id"]) for worker in workers), 240,
                                 workers, "both honest peers to ban the noisy rogue")
                banned_at = time.time()
                epochs_at_ban = [worker.epoch() for worker in workers]
                for worker, epoch in zip(workers, epochs_at_ban):
                    worker.wait_for(lambda w: w.epoch() >= epoch + 2, 180, "two epochs after the ban")
                late_rounds = [line for line in rogue.rounds(phase["phase"]) if line["time"] > banned_at + 1.0]
                assert not late_rounds, f"the banned rogue still joined rounds: {late_rounds}"
            else:
                # named (for what only this attack gives away, where there is such a thing: stale parameters are
                # also far from the swarm's, but a replayed update is only ever the same as before)
                rogue.wait_until(lambda: reasons_named(workers, phase["peer_id"]) & EXPECTED_REASONS.get(name, REASONS), 180,
                                 workers, f"an honest peer to name the {name} rogue for {EXPECTED_REASONS.get(name, 'anything')}")
                rogue.wait_until(lambda: len(rogue.rounds(phase["phase"])) >= rounds_per_phase, 120 * rounds_per_phase,
                                 workers, f"the {name} rogue to join {rounds_per_phase} rounds")
        rogue.send("stop")
        last_round = max(line["time"] for phase in phases for line in rogue.rounds(phase["phase"]))
        rows = []
        for phase in phases:
            rounds = [line["time"] for line in rogue.rounds(phase["phase"])]
            for worker in workers:
                worker.wait_for(lambda w: validation_loss_around(w, min(rounds), max(rounds))[1] is not None, 180,
                                f"two epochs after the {phase['attack']} rogue's last round")
                before, after = validation_loss_around(worker, min(rounds), max(rounds))
                rows.append({"attack": phase["attack"], "peer": worker.spec["nickname"], "rounds": len(rounds),
                             "reasons": sorted(reasons_named(workers, phase["peer_id"])),
                             "before": {"epoch": before["epoch"], "val_loss": before["val_loss"]},
                             "after": {"epoch": after["epoch"], "val_loss": after["val_loss"]}})
        for worker in workers:
            assert_all_finite(worker)
            assert [report for report in worker.of_type("epoch") if report["ended_at"] > last_round]
        return rows
    finally:
        if rogue is not None:
            rogue.kill()
        stop_all(workers)


def assert_not_wrecked(rows: list[dict]) -> None:
    """Each honest peer's validation loss after each phase is at most 1.10 x its value before."""
    for row in rows:
        before, after = row["before"], row["after"]
        print(f"{row['attack']:>12} {row['peer']}: validation loss {before['val_loss']:.3f} (epoch {before['epoch']}) -> "
              f"{after['val_loss']:.3f} (epoch {after['epoch']}); {row['rounds']} rounds; named for {', '.join(row['reasons'])}")
        assert after["val_loss"] <= 1.10 * before["val_loss"], (
            f"{row['attack']}: {row['peer']}'s validation loss went from {before['val_loss']:.3f} "
            f"(epoch {before['epoch']}) to {after['val_loss']:.3f} (epoch {after['epoch']})")


def diloco_catalogue_run() -> tuple[dict, list[tuple[str, str, bool, str]]]:
    """The DiLoCo run the rogue attacks (the default rounds, which end on the swarm's samples) and its averager."""
    manifest = run_manifest("rogue-diloco", mode="diloco", local_steps=8, target_batch_size=64, inner_lr=2e-3)
    prefix = f"{averaging_prefix(parse_manifest(manifest))}_diloco"
    return manifest, [(prefix, PseudoGradientAverager.__name__, False, "pseudo-gradient")]


def sync_catalogue_run() -> tuple[dict, list[tuple[str, str, bool, str]]]:
    """The sync run the rogue attacks; hivemind.Optimizer averages gradients, then parameters (which
    require grad), each epoch."""
    manifest = run_manifest("rogue-sync", target_batch_size=64)
    prefix = averaging_prefix(parse_manifest(manifest))
    return manifest, [(f"{prefix}_grad_averager", CountingGradientAverager.__name__, False, "gradient"),
                      (f"{prefix}_state_averager", CheckedTrainingStateAverager.__name__, True, "parameters")]


@pytest.mark.timeout(900)
def test_a_rogue_cannot_wreck_a_diloco_run_and_is_named(tmp_path):
    assert_not_wrecked(attack_catalogue(tmp_path, *diloco_catalogue_run()))


@pytest.mark.timeout(900)
def test_a_rogue_cannot_wreck_a_sync_run_and_is_named(tmp_path):
    assert_not_wrecked(attack_catalogue(tmp_path, *sync_catalogue_run()))
