"""Convergence and communication at equal total samples, shaped like Table 2 of the DiLoCo paper.

    nice -n 10 .venv/bin/python benchmarks/convergence.py [--total-samples N] [--quick]

writes ``benchmarks/convergence_results.md`` (the table, goals and notes),
``convergence_loss.png`` and ``convergence_bytes.png`` (the plots need matplotlib);
``--save FILE`` the raw results with the commit, date, machine, load and setup,
from which ``benchmarks/results.py`` renders RESULTS.md's table (``rows_table``;
mark it ``<!-- table: convergence from FILE -->``). First the tiny preset is
pretrained here on ``--pretrain-samples`` and saved as a model directory with its
byte tokenizer (what ``p2ptrain export`` writes); every configuration fine-tunes
that directory, on the stdlib corpus, from the same weights:

- 1 peer at micro-batch B and at 4B: a plain PyTorch AdamW loop in this process;
- 4 peers ``diloco`` at each ``--local-steps`` H (8-bit blockwise compression),
  and optionally at the middle H without compression, or at a sparse rung of the
  compression ladder (``--swarms diloco-sparse2bit-64of4096``, with error feedback);
- 4 peers ``sync``: four real worker processes (hivemind on 127.0.0.1),
  target_batch_size 4B, each contributing B per step.

Every configuration trains on the same total number of samples: DiLoCo peers
finish after the outer step that completes it; sync peers are paused once the
samples they trained add up to it (hivemind keeps accumulating local batches
while a round's matchmaking runs, so counting epochs would overshoot). The eval loss is
measured here, on the same fixed validation windows, for each peer's final model
(read from the checkpoint the worker writes when it finishes), averaged over peers.
Bytes per sample are computed from the averaging rounds the workers report (for a
sparse rung: the payload its codecs encoded, which each worker's checkpoint
counts), and measured as the TCP bytes the workers' p2pd daemons sent (``ss -tin``).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import torch

from run_facts import facts

from p2ptrain.peers.model.checkpoint import checkpoint_path, load_checkpoint
from p2ptrain.peers.compression.ladder import DENSE_BYTES_PER_VALUE, parse_rung
from p2ptrain.peers.model.data import train_batches, validation_batches
from p2ptrain.peers.model.models import build_model, causal_lm_loss, mean_loss
from p2ptrain.peers.training.optimizers import learning_rate_factor
from p2ptrain.peers.model.tokenizers import ByteTokenizer
from p2ptrain.peers.worker.run_setup import VALIDATION_BATCHES, stream_seed
from p2ptrain.peers.worker.training_worker import main as worker_main

HERE = Path(__file__).resolve().parent
PEERS = 4
DATASET = {"kind": "stdlib"}
SEED = 1
FINAL_EVAL_BATCHES = 32
# final eval windows are batched by this many, whatever B is, so budgets with different B compare
EVAL_BATCH = 8
# starting a worker (torch, hivemind, p2pd) took over 3 minutes when the shared machine's load was ~35
JOIN_TIMEOUT_S = 900
# workers start one at a time across parallel configurations: twelve started together on a loaded
# machine missed the worker's 60 s DHT start timeout
STARTING = threading.Lock()
# Bytes a value takes on the wire. Blockwise 8-bit: one byte, a float32 scale per
# 4096 values, and a 256-entry float32 codebook per chunk of 2**19 fp32 bytes
# (hivemind's default part size for all-reduce), i.e. 1024 bytes per 131072 values.
BYTES_PER_VALUE = DENSE_BYTES_PER_VALUE
SWARMS = ["baselines", "diloco-blockwise8bit", "sync-none", "diloco-none"]


@dataclass
class Result:
    """One configuration's outcome: what goes in a table row and on the plots."""

    name: str
    samples: int
    eval_losses: list[float]
    curve: list[tuple[int, float]]
    rounds: int = 0
    computed_bytes: float = 0.0
    measured_bytes: float | None = None
    notes: str = ""
    order: float = 0.0  # table and plot position: baselines, diloco by H, sync

    @property
    def eval_loss(self) -> float:
        return sum(self.eval_losses) / len(self.eval_losses)


@dataclass
class Setup:
    """What every configuration shares: sizes, lr, data and the validation windows."""

    total_samples: int
    micro_batch: int
    seq_len: int
    inner_lr: float
    lr_schedule: str  # "constant", or "cosine" to 0 at the last step of every configuration
    outer_lr: float
    outer_momentum: float
    cache_dir: Path
    work_dir: Path
    timeout_s: float
    model: str = "tiny"  # the preset, or the directory of the pretrained start
    pretrained_loss: float | None = None
    pretrain_samples: int = 0
    error_feedback_decay: float = 1.0  # sparse rungs' (the manifest's error_feedback_decay)
    parameters: int = 0
    final_windows: list = field(default_factory=list)
    curve_windows: list = field(default_factory=list)

    def __post_init__(self):
        loaded = build_model(self.model, seed=SEED)
        tokenizer, self.parameters = loaded.tokenizer, loaded.trainable_parameters
        self.final_windows = validation_batches(DATASET, tokenizer, self.seq_len, EVAL_BATCH, self.cache_dir, FINAL_EVAL_BATCHES)
        # what a worker's epoch report measures, so the curves compare
        self.curve_windows = validation_batches(DATASET, tokenizer, self.seq_len, self.micro_batch, self.cache_dir, VALIDATION_BATCHES)


def allreduce_bytes(group_size: int, values: int, bytes_per_value: float) -> float:
    """Bytes one peer sends in one butterfly all-reduce: its share of the other peers'
    parts in reduce-scatter, and its averaged part back to them in all-gather."""
    return 2 * (group_size - 1) / group_size * values * bytes_per_value


def every_step_allreduce_bytes_per_sample(setup: Setup) -> float:
    """The reference: 4 peers all-reduce fp32 gradients after every step of B samples each."""
    return PEERS * allreduce_bytes(PEERS, setup.parameters, 4.0) / (PEERS * setup.micro_batch)


def plan_name(setup: Setup, mode: str, local_steps: int, compression: str) -> str:
    """The table name of a configuration (``mode`` "baseline": ``local_steps`` is the batch in B)."""
    if mode == "baseline":
        label = "B" if local_steps == 1 else f"{local_steps}B"
        return f"1 peer, batch {label} ({local_steps * setup.micro_batch})"
    if mode == "sync":
        return "4 peers, sync"
    decay = f", error feedback decay {setup.error_feedback_decay:g}" if parse_rung(compression).sparse and setup.error_feedback_decay != 1 else ""
    return f"4 peers, diloco H={local_steps}, {compression}{decay}"


def pretrained_model(samples: int, batch: int, seq_len: int, lr: float, cache_dir: Path) -> Path:
    """The tiny preset trained from scratch on ``samples`` samples (AdamW at ``lr``, its own data
    stream) and saved with its byte tokenizer, as ``p2ptrain export`` would: the pretrained start
    every configuration fine-tunes (``--model DIRECTORY``), like the DiLoCo paper's runs start
    from a pretrained checkpoint. Made once and kept in ``cache_dir`` (this and ``diloco_study.py``
    share it)."""
    directory = cache_dir / f"pretrained-{samples}-b{batch}-s{seq_len}-lr{lr:g}"
    if not (directory / "config.json").is_file():
        pretrain(samples, batch, seq_len, lr, cache_dir, directory)
    return directory


def pretrain(samples: int, batch: int, seq_len: int, lr: float, cache_dir: Path, directory: Path) -> None:
    """Train the tiny preset from scratch and save it into ``directory`` (see ``pretrained_model``)."""
    loaded = build_model("tiny", seed=SEED)
    optimizer = torch.optim.AdamW(loaded.trainable(), lr=lr)
    batches = train_batches(DATASET, loaded.tokenizer, seq_len, batch, stream_seed(SEED, "pretrain"), cache_dir)
    for _ in range(samples // batch):
        causal_lm_loss(loaded.model, next(batches)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    loaded.model.save_pretrained(directory)
    ByteTokenizer().save_pretrained(directory)


def train_single(setup: Setup, batch: int, seed: int = SEED, curve: bool = True) -> tuple:
    """One peer, a plain AdamW loop at ``batch`` samples per step on the data stream of ``seed``,
    at ``setup``'s lr and schedule; returns the trained model (``build_model``'s) and its curve:
    (samples, loss on the curve windows) about 30 times (empty when ``curve`` is false)."""
    torch.manual_seed(seed)
    loaded = build_model(setup.model, seed=SEED)
    optimizer = torch.optim.AdamW(loaded.trainable(), lr=setup.inner_lr)
    batches = train_batches(DATASET, loaded.tokenizer, setup.seq_len, batch, stream_seed(seed, "baseline"), setup.cache_dir)
    steps = setup.total_samples // batch
    every = max(1, steps // 30)
    points = []
    for step in range(1, steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = setup.inner_lr * learning_rate_factor(step - 1, 0, setup.lr_schedule, steps)
        causal_lm_loss(loaded.model, next(batches)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if curve and (step % every == 0 or step == steps):
            points.append((step * batch, mean_loss(loaded.model, setup.curve_windows)))
    return loaded, points


def run_single(setup: Setup, batch: int) -> Result:
    """One peer, a plain AdamW loop at ``batch`` samples per step."""
    loaded, curve = train_single(setup, batch)
    steps = setup.total_samples // batch
    return Result(plan_name(setup, "baseline", batch // setup.micro_batch, ""), steps * batch, [mean_loss(loaded.model, setup.final_windows)], curve, order=batch)


class Worker:
    """One real worker process started as the daemon starts it, and its reports.

    ``address``: the IPv4 address its DHT listens on; ``namespace``: the network namespace
    (``ip netns``) it runs in, None for this process's own.
    """

    def __init__(self, home: Path, name: str, manifest: dict, initial_peers: list[str], setup: Setup, matchmaking_time: float,
                 address: str = "127.0.0.1", namespace: str | None = None):
        for sub in ("state", "checkpoints"):
            (home / sub).mkdir(parents=True, exist_ok=True)
        self.name = name
        self.checkpoint = checkpoint_path(home / "checkpoints", manifest["run_id"])
        spec = {
            "run_id": manifest["run_id"], "manifest": manifest if not initial_peers else {}, "new_run": not initial_peers,
            "initial_peers": initial_peers,
            "paths": {"state_dir": str(home / "state"), "cache_dir": str(setup.cache_dir),
                      "checkpoints_dir": str(home / "checkpoints"), "identity_key": str(home / "state" / "identity.key")},
            "dht": {"host_maddrs": [f"/ip4/{address}/tcp/0"], "announce_maddrs": [], "use_relay": False,
                    "use_auto_relay": False, "client_mode": False},
            "nickname": name, "plan": {"device": "cpu", "precision": "fp32", "quantization": "none",
                                       "micro_batch": setup.micro_batch, "grad_accum": 1, "cpu_threads": 1},
            # paused until every peer joined, so no peer trains alone at the start
            "start_paused": True, "log_level": "ERROR",
            "averaging": {"matchmaking_time": matchmaking_time, "averaging_timeout": 60.0},
        }
        context = multiprocessing.get_context("spawn")
        self.conn, child_conn = context.Pipe()
        target, args = (worker_main, (child_conn, spec)) if namespace is None else (worker_in_namespace, (namespace, child_conn, spec))
        self.process = context.Process(target=target, args=args, name=f"worker-{name}")
        self.process.start()
        child_conn.close()
        self.reports: list[dict] = []
        self.local_epoch = 0
        self.finish_sent = False
        self.pause_sent = False
        self.trained = 0

    def drain(self) -> None:
        while True:
            try:
                if not self.conn.poll():
                    return
                report = self.conn.recv()
            except (EOFError, OSError):
                return
            self.reports.append(report)
            if report["type"] == "step":
                self.trained += report["samples"]
            elif report["type"] == "epoch":
                self.local_epoch = max(self.local_epoch, report["epoch"] + 1)
            elif report["type"] == "event" and report["kind"] == "state-downloaded":
                self.local_epoch = max(self.local_epoch, int(report["data"]["epoch"]))
            elif report["type"] == "error" and report.get("fatal"):
                raise RuntimeError(f"{self.name} failed: {report['message']}")

    def tend(self, run: str, finish_after: int | None) -> None:
        """Take its reports, fail when it exited before it stopped, and tell it to ``finish`` (complete the
        current epoch, checkpoint, pause) once it is in epoch ``finish_after`` (None: never)."""
        self.drain()
        if not self.process.is_alive():
            self.drain()  # what it reported before it exited
            if not self.stopped():  # a finished or paused worker exits after its checkpoint
                raise RuntimeError(f"{run}: {self.name} exited with {self.process.exitcode}")
        if finish_after is not None and not self.finish_sent and self.local_epoch >= finish_after - 1:
            self.conn.send({"cmd": "finish"})
            self.finish_sent = True

    def of_type(self, kind: str) -> list[dict]:
        return [report for report in self.reports if report["type"] == kind]

    def state(self) -> str | None:
        states = self.of_type("state")
        return states[-1]["state"] if states else None

    def wait_joined(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while not self.of_type("joined"):
            if time.monotonic() > deadline or not self.process.is_alive():
                raise RuntimeError(f"{self.name} did not join (alive: {self.process.is_alive()}); last reports {self.reports[-3:]}")
            self.conn.poll(0.2)
            self.drain()
        return self.of_type("joined")[0]

    def stopped(self) -> bool:
        """Finished (DiLoCo's ``finish``), or paused by us with its checkpoint written (sync)."""
        if self.state() == "finished":
            return True
        return self.pause_sent and self.state() == "paused" and any(
            r["kind"] == "checkpoint-saved" and r["data"].get("reason") == "pause" for r in self.of_type("event"))

    def rounds(self) -> list[int]:
        """Sizes of the averaging rounds this peer finished with at least one other peer."""
        return [r["data"]["peers"] for r in self.of_type("event") if r["kind"] == "averaged" and r["data"]["peers"] >= 2]

    def p2pd_pids(self) -> set[int]:
        try:
            children = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return set()
        return {child.pid for child in children if "p2pd" in child.name()}

    def kill_group(self) -> None:
        try:
            pgid = os.getpgid(self.process.pid)
            if pgid != os.getpgid(0):
                os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, TypeError):
            pass
        if self.process.is_alive():
            self.process.kill()
        self.process.join(10)


def worker_in_namespace(namespace: str, conn, spec: dict) -> None:
    """A worker process's entry inside the network namespace ``namespace`` (its p2pd and DHT
    processes start there too); needs root."""
    import ctypes

    clone_newnet = 0x40000000  # os.CLONE_NEWNET and os.setns arrived in Python 3.12
    libc = ctypes.CDLL(None, use_errno=True)
    descriptor = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
    try:
        if libc.setns(descriptor, clone_newnet) != 0:
            raise OSError(ctypes.get_errno(), f"cannot enter network namespace {namespace}")
    finally:
        os.close(descriptor)
    worker_main(conn, spec)


class SentBytes:
    """TCP bytes sent by a set of processes, from the kernel's per-socket counters (``ss -tin``).

    Sockets are polled; a socket that closes between two polls loses what it sent
    since the last poll, so this slightly undercounts.
    """

    def __init__(self):
        self.per_socket: dict[tuple, int] = {}

    def poll(self, pids: set[int]) -> None:
        if not pids:
            return
        output = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True, timeout=30).stdout
        key = None
        for line in output.splitlines():
            if not line.startswith((" ", "\t")):
                fields = line.split()
                owner = next((int(part.split("=")[1].rstrip(")").split(",")[0]) for part in line.split(",") if part.startswith("pid=")), None)
                key = (owner, fields[3], fields[4]) if owner in pids and len(fields) >= 5 else None
            elif key is not None:
                for part in line.split():
                    if part.startswith("bytes_sent:"):
                        self.per_socket[key] = max(self.per_socket.get(key, 0), int(part.split(":")[1]))

    @property
    def total(self) -> int:
        return sum(self.per_socket.values())


def run_swarm(setup: Setup, mode: str, local_steps: int, compression: str) -> Result:
    """Four real workers, evaluated from the checkpoint each writes when it stops.

    DiLoCo: each is told to finish once the swarm reached the outer step that makes
    ``total_samples``. Sync: all are paused once the samples they reported add up
    to ``total_samples`` (at most a second of steps per peer more)."""
    per_epoch = PEERS * setup.micro_batch * (local_steps if mode == "diloco" else 1)
    epochs = max(1, setup.total_samples // per_epoch)
    name = plan_name(setup, mode, local_steps, compression)
    run_id = f"convergence-{mode}-{local_steps}-{compression}-{os.getpid()}"
    manifest = {
        "run_id": run_id, "mode": mode, "model": setup.model, "dataset": DATASET, "seq_len": setup.seq_len,
        "target_batch_size": per_epoch, "local_steps": local_steps, "micro_batch_hint": setup.micro_batch,
        # the paper's setting on equal peers: every round is H inner steps on every peer
        "round_end": "local_steps",
        "inner_lr": setup.inner_lr, "outer_lr": setup.outer_lr, "outer_momentum": setup.outer_momentum, "compression": compression,
        "error_feedback_decay": setup.error_feedback_decay,
        "seed": SEED, "created_at": time.time(), "lr_schedule": setup.lr_schedule,
        # the schedule ends with the last epoch; a sync epoch gathers more than its target while
        # matchmaking runs, so sync ends before its rate reaches 0
        "total_epochs": epochs if setup.lr_schedule != "constant" else None,
    }
    matchmaking_time = 1.0 if mode == "sync" else 3.0
    home = setup.work_dir / run_id
    workers: list[Worker] = []
    sent = SentBytes()
    try:
        for index in range(PEERS):
            with STARTING:
                initial_peers = [workers[0].of_type("joined")[0]["addresses"][0]] if workers else []
                workers.append(Worker(home / f"peer{index}", f"peer{index}", manifest, initial_peers, setup, matchmaking_time))
                workers[-1].wait_joined(JOIN_TIMEOUT_S)
        pids = set().union(*(worker.p2pd_pids() for worker in workers))
        sent.poll(pids)
        baseline_bytes = sent.total
        for worker in workers:
            worker.conn.send({"cmd": "resume"})
        deadline = time.monotonic() + setup.timeout_s
        last_poll = 0.0
        started = time.monotonic()
        while not all(worker.stopped() for worker in workers):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}: not finished after {setup.timeout_s:.0f} s (epochs {[w.local_epoch for w in workers]} of {epochs})")
            time.sleep(0.2)
            for worker in workers:
                worker.tend(name, epochs if mode == "diloco" else None)
            if mode == "sync" and sum(worker.trained for worker in workers) >= setup.total_samples:
                for worker in workers:
                    if not worker.pause_sent:
                        worker.conn.send({"cmd": "pause"})
                        worker.pause_sent = True
            if time.monotonic() - last_poll > 2.0:
                sent.poll(pids)
                last_poll = time.monotonic()
        sent.poll(pids)
        states = [load_checkpoint(worker.checkpoint) for worker in workers]
        if any(state is None for state in states):
            raise RuntimeError(f"{name}: a finished worker left no readable checkpoint")
    finally:
        for worker in workers:
            worker.kill_group()
    eval_losses = []
    for state in states:
        loaded = build_model(setup.model, seed=SEED)
        loaded.load_trainable_state(state["trainable"])
        eval_losses.append(mean_loss(loaded.model, setup.final_windows))
    samples = sum(int(state["trained_samples"]) for state in states)
    rounds = [worker.rounds() for worker in workers]
    if parse_rung(compression).sparse:
        # what the sparse codecs encoded: the parts sent to reducers and the reducers' answers
        computed = sum(int(state["trainer"]["sparse_payload_bytes"]) for state in states)
    else:
        computed = sum(allreduce_bytes(size, setup.parameters, BYTES_PER_VALUE[compression]) for sizes in rounds for size in sizes)
    downloads = sum(1 for worker in workers for r in worker.of_type("event") if r["kind"] == "state-downloaded")
    seconds = time.monotonic() - started
    epochs_done = max(int(state["epoch"]) for state in states)
    notes = (f"{epochs_done} epochs (target {per_epoch} samples each) in {seconds / 60:.1f} min; "
             f"{downloads} state downloads by peers that fell behind")
    if mode == "sync":
        # hivemind.Optimizer also averages the parameters after each epoch (average_state_every=1)
        computed *= 2
        notes += ("; gradients and parameters averaged each epoch; stopped by pausing every peer once the samples "
                  "they trained reached the total (an epoch gathers more than its target while matchmaking runs)")
    # a sync epoch gathers more samples than its target, so its reports have no sample count to plot against
    curve = [] if mode == "sync" else [((report["epoch"] + 1) * per_epoch, report["val_loss"]) for report in workers[0].of_type("epoch")]
    return Result(name, samples, eval_losses, curve, rounds=max(len(r) for r in rounds),
                  computed_bytes=computed / samples, measured_bytes=(sent.total - baseline_bytes) / samples, notes=notes,
                  order=1e6 if mode == "sync" else 1e3 + local_steps + (compression == "none") / 2 + parse_rung(compression).sparse / 4)


# (the issue, the rows it judges, the reduction it asks for): both ask for eval loss within 2 % of 1 peer 4B
GOALS = [("issue 4", "8-bit DiLoCo", lambda name: "blockwise8bit" in name, 1000),
         ("issue 15", "sparse DiLoCo", lambda name: ", sparse" in name, 10_000)]


def goals(results: list[Result], baseline: Result, reference: float) -> list[str]:
    """The issues' goals, judged on these results: DiLoCo within 2 % of the 4B baseline's eval
    loss, at >= 1000x (8-bit, issue 4) or >= 10,000x (sparse, issue 15) fewer bytes per sample
    than the reference."""
    lines = []
    for issue, kind, judged, factor in GOALS:
        rows = [result for result in results if "diloco" in result.name and judged(result.name) and result.rounds]
        if not rows:
            continue
        lines += [f"Goals ({issue}), per {kind} configuration:", ""]
        for result in rows:
            delta = 100 * (result.eval_loss - baseline.eval_loss) / baseline.eval_loss
            reduction = reference / result.computed_bytes
            lines.append(f"- {result.name}: eval loss {delta:+.2f} % vs 1 peer 4B (goal within 2 %: "
                         f"{'met' if delta <= 2 else 'not met'}); {reduction:,.0f}x fewer bytes per sample "
                         f"computed (goal >= {factor:,}x: {'met' if reduction >= factor else 'not met'}); both at once: "
                         f"{'yes' if delta <= 2 and reduction >= factor else 'no'}.")
        lines.append("")
    return lines[:-1] or ["Goals: no 8-bit or sparse DiLoCo configuration finished in this run."]


def schedule_words(setup: Setup) -> str:
    if setup.lr_schedule == "constant":
        return "constant"
    return (f"with a {setup.lr_schedule} decay to 0 at each configuration's last step (DiLoCo: the manifest's "
            f"lr_schedule and total_epochs, counted in inner steps)")


def start_sentence(setup: Setup) -> str:
    if not setup.pretrain_samples:
        return "Training starts from the preset's random weights."
    return (f"Training starts from the tiny preset pretrained here on {setup.pretrain_samples:,} samples (batch "
            f"{2 * setup.micro_batch}, its own data order; eval loss {setup.pretrained_loss:.4f}) and saved as a model "
            f"directory, which every configuration fine-tunes (`--model DIR`), as the DiLoCo paper's runs start from a "
            f"pretrained checkpoint.")


def markdown(setup: Setup, results: list[Result], command: str, seconds: float) -> str:
    reference = every_step_allreduce_bytes_per_sample(setup)
    baseline = next(result for result in results if result.name.startswith("1 peer, batch 4B"))
    lines = [
        "# Convergence at equal total samples (DiLoCo Table 2 shape)", "",
        f"Command: `{command}` ({seconds / 60:.0f} min on this machine).", "",
        f"Model `tiny` ({setup.parameters:,} parameters, byte vocabulary), stdlib corpus, seq_len {setup.seq_len}, "
        f"B = {setup.micro_batch} samples, AdamW lr {setup.inner_lr} {schedule_words(setup)} (the inner lr for DiLoCo), outer "
        f"{'Nesterov ' if setup.outer_momentum else ''}SGD lr {setup.outer_lr} momentum {setup.outer_momentum}. "
        f"{start_sentence(setup)} Every configuration starts from the same weights and trains "
        f"on {setup.total_samples:,} samples ({setup.total_samples // (PEERS * setup.micro_batch)} steps per peer of 4). "
        f"Eval loss: mean cross-entropy (nats/byte) on {FINAL_EVAL_BATCHES * EVAL_BATCH} fixed validation windows, "
        f"measured on each peer's final model, mean over peers.", "",
        "| config | total samples | eval loss | Δ vs 1 peer 4B | averaging rounds per peer | bytes/sample computed | "
        "bytes/sample measured | reduction vs every-step fp32 all-reduce (computed) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        f"| every-step fp32 all-reduce, 4 peers (reference) | | | | 1 per step | {reference:,.0f} | | 1x |",
    ]
    for result in results:
        delta = 100 * (result.eval_loss - baseline.eval_loss) / baseline.eval_loss
        spread = f" (±{(max(result.eval_losses) - min(result.eval_losses)) / 2:.3f})" if len(result.eval_losses) > 1 else ""
        if result.rounds:
            communication = (f"{result.rounds} | {result.computed_bytes:,.0f} | {result.measured_bytes:,.0f} | "
                             f"{reference / result.computed_bytes:,.0f}x")
        else:
            communication = "0 | 0 | | no communication"
        lines.append(f"| {result.name} | {result.samples:,} | {result.eval_loss:.4f}{spread} | {delta:+.2f} % | {communication} |")
    lines += ["", *goals(results, baseline, reference), "", "Notes:", ""]
    lines += [f"- {result.name}: {result.notes}" for result in results if result.notes]
    lines += [
        "- bytes/sample = bytes sent by all peers together ÷ samples trained by all peers together.",
        "- computed: for each averaging round a peer finished with g peers, 2·(g−1)/g · parameters · bytes per value "
        "(butterfly all-reduce: reduce-scatter + all-gather); fp32 4 bytes, blockwise 8-bit "
        f"{BYTES_PER_VALUE['blockwise8bit']:.4f} bytes (scales and codebooks included). The reference is that formula "
        "for 4 peers, fp32, after every step of 4·B samples. A sparse rung's rows count the payload its codecs encoded "
        "(`p2ptrain/peers/compression/codecs.py`, formats in `compression/sparse.py`: each peer's top-k parts for the other reducers and its answers, on the "
        "union of the group's entries, to the other senders), as every worker's checkpoint records it.",
        "- measured: TCP bytes_sent of every socket of the four workers' p2pd daemons (`ss -tin`), from the moment all "
        "peers joined to the end: includes DHT traffic, progress records, matchmaking, libp2p framing and encryption, "
        "and state downloads of peers that fell behind. Polled every 2 s; sockets closed between polls are undercounted.",
        "- The reduction factor of DiLoCo vs the every-step all-reduce is H × (4 bytes ÷ bytes per value) when every round has "
        "all 4 peers: H × 3.96 with blockwise 8-bit, so H = 250 gives 991x and ≥ 1000x needs H ≥ 253 (e.g. 256). Rounds with "
        "fewer peers send less (and average less), which is how a row can exceed that.",
    ]
    return "\n".join(lines) + "\n"


def load_results(path: Path) -> tuple[list[Result], dict]:
    """The results of a ``--save`` file and its facts (commit, date, machine, load, setup); a file
    of the older format is the list of results alone."""
    data = json.loads(path.read_text())
    rows, facts = (data, {}) if isinstance(data, list) else (data["results"], {k: v for k, v in data.items() if k != "results"})
    return [Result(**row) for row in rows], facts


def rows_table(path: Path) -> str:
    """The table RESULTS.md shows of a ``--save`` file: every row against its 1 peer 4B baseline,
    bytes against the every-step fp32 all-reduce of the tiny preset (files of the older format
    hold no setup: B = 4 and the preset's parameters, what every run so far used)."""
    results, facts = load_results(path)
    setup = facts.get("setup") or {}
    parameters = setup.get("parameters") or build_model("tiny", seed=SEED).trainable_parameters
    reference = PEERS * allreduce_bytes(PEERS, parameters, 4.0) / (PEERS * setup.get("micro_batch", 4))
    baseline = next(result for result in results if result.name.startswith("1 peer, batch 4B"))
    lines = ["| config | total samples | eval loss | Δ vs 1 peer 4B | averaging rounds per peer | bytes/sample computed | "
             "bytes/sample measured | reduction vs every-step fp32 all-reduce (computed) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for result in sorted(results, key=lambda result: result.order):
        delta = 100 * (result.eval_loss - baseline.eval_loss) / baseline.eval_loss
        measured = f"{result.measured_bytes:,.0f}" if result.measured_bytes else ""
        reduction = f"{reference / result.computed_bytes:,.0f}x" if result.rounds else "no communication"
        lines.append(f"| {result.name} | {result.samples:,} | {result.eval_loss:.4f} | {delta:+.2f} % | {result.rounds} | "
                     f"{result.computed_bytes:,.0f} | {measured} | {reduction} |")
    return "\n".join(lines)


def plot(results: list[Result], setup: Setup, out_dir: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots (pip install matplotlib)", file=sys.stderr)
        return False
    figure, (curves, finals) = plt.subplots(1, 2, figsize=(13, 5))
    for result in results:
        if result.curve:
            curves.plot(*zip(*result.curve), marker="." if len(result.curve) < 40 else None, label=result.name)
    curves.set(xlabel="samples trained (swarm total)", ylabel=f"validation loss ({VALIDATION_BATCHES * setup.micro_batch} windows)",
               title="Validation loss while training")
    curves.legend(fontsize=8)
    finals.barh([r.name for r in results], [r.eval_loss for r in results], color="tab:blue")
    low = min(r.eval_loss for r in results)
    finals.set_xlim(low * 0.95, max(r.eval_loss for r in results) * 1.02)
    finals.set(xlabel="final eval loss (mean over peers)", title=f"At {setup.total_samples:,} samples")
    figure.tight_layout()
    figure.savefig(out_dir / "convergence_loss.png", dpi=110)
    figure, axis = plt.subplots(figsize=(9, 4.5))
    names = ["every-step fp32 all-reduce"] + [r.name for r in results if r.rounds]
    values = [every_step_allreduce_bytes_per_sample(setup)] + [r.computed_bytes for r in results if r.rounds]
    measured = [math.nan] + [r.measured_bytes or math.nan for r in results if r.rounds]
    positions = range(len(names))
    axis.barh([p - 0.2 for p in positions], values, height=0.4, label="computed")
    axis.barh([p + 0.2 for p in positions], measured, height=0.4, label="measured (TCP bytes of p2pd)")
    axis.set_yticks(list(positions), names)
    axis.set_xscale("log")
    axis.set(xlabel="bytes sent per sample (log scale)", title="Communication per training sample")
    axis.legend()
    figure.tight_layout()
    figure.savefig(out_dir / "convergence_bytes.png", dpi=110)
    return True


def save_results(path: Path, setup: Setup, results: list[Result], facts: dict) -> None:
    """The ``--save`` file: the run's facts (``run_facts.facts()`` at its start), its setup and its results."""
    shared = {key: getattr(setup, key) for key in ("total_samples", "micro_batch", "seq_len", "inner_lr", "lr_schedule",
                                                    "outer_lr", "outer_momentum", "pretrain_samples", "pretrained_loss",
                                                    "error_feedback_decay", "parameters")}
    path.write_text(json.dumps({"benchmark": "convergence", **facts, "load_now": os.getloadavg(), "setup": shared,
                                "results": [result.__dict__ for result in results]}))


def write_outputs(setup: Setup, results: list[Result], command: str, started: float, out_dir: Path) -> str:
    """Write the markdown table, RESULTS.md's section and the plots for the results so far; returns the markdown."""
    results = sorted(results, key=lambda result: result.order)
    text = markdown(setup, results, command, time.monotonic() - started)
    (out_dir / "convergence_results.md").write_text(text)
    plot(results, setup, out_dir)
    return text


def swarm_name(text: str) -> str:
    """A ``--swarms`` entry: one of ``SWARMS`` or ``diloco-<sparse rung>``."""
    if text in SWARMS or (text.startswith("diloco-") and parse_rung(text.removeprefix("diloco-")).sparse):
        return text
    raise argparse.ArgumentTypeError(f"unknown swarm {text!r}: use {', '.join(SWARMS)} or diloco-<sparse rung>")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--total-samples", type=int, default=None,
                        help="samples per configuration (default 25600, --quick 1280); a multiple of 4·B·H keeps DiLoCo "
                             "rows at exactly this many (25600 = 16 · 1600 steps: H = 20, 50, 100, 320 all divide 1600)")
    parser.add_argument("--quick", action="store_true", help="shorter sequences and fewer samples: a smoke run")
    parser.add_argument("--micro-batch", type=int, default=4, help="B, samples per step per peer")
    parser.add_argument("--inner-lr", type=float, default=3e-3, help="AdamW lr of the baselines and of DiLoCo's inner steps")
    parser.add_argument("--lr-schedule", choices=["constant", "cosine"], default="constant",
                        help="AdamW learning rate of every configuration: constant, or cosine to 0 at its last step")
    # the plain average of the peers' models: best in diloco_study at this budget (the paper's 0.7 / 0.9
    # needs many more outer steps than a short fine-tuning run has)
    parser.add_argument("--outer-lr", type=float, default=1.0, help="DiLoCo's outer SGD learning rate")
    parser.add_argument("--outer-momentum", type=float, default=0.0, help="DiLoCo's outer Nesterov momentum (0: none)")
    parser.add_argument("--local-steps", type=int, nargs="+", default=[20, 50, 100, 320],
                        help="H values for diloco (>= 253 sends >= 1000x fewer bytes than the every-step all-reduce at 8 bits)")
    parser.add_argument("--swarms", nargs="*", default=["baselines", "diloco-blockwise8bit", "sync-none"], type=swarm_name,
                        help=f"which configurations to run: {', '.join(SWARMS)} or diloco-<sparse rung> (e.g. "
                             f"diloco-sparse2bit-64of4096, at each --local-steps)")
    parser.add_argument("--error-feedback-decay", type=float, default=1.0,
                        help="sparse rungs: the share of what a peer did not send that it carries into the next round")
    parser.add_argument("--cache-dir", type=Path, default=None, help="token cache to reuse (default: a temporary one)")
    parser.add_argument("--out-dir", type=Path, default=HERE)
    parser.add_argument("--parallel", type=int, default=1,
                        help="configurations run at once; on a machine shared with other "
                             "work, more of them get more of its CPU")
    parser.add_argument("--save", type=Path, help="also write the results so far to this JSON file")
    parser.add_argument("--load", type=Path, nargs="*", default=[],
                        help="results of earlier runs (--save files) to include; their configurations are not run again")
    parser.add_argument("--pretrain-samples", type=int, default=None,
                        help="pretrain the tiny preset on this many samples first and start every configuration "
                             "from it (default 24000, --quick 2000; 0: start from random weights)")
    parser.add_argument("--timeout", type=float, default=1500, help="seconds one swarm configuration may take (sync needs ~5 s a round on a busy 2-core machine)")
    args = parser.parse_args()
    total = args.total_samples or (1280 if args.quick else 25600)
    started, before = time.monotonic(), facts()
    pretrain_samples = args.pretrain_samples if args.pretrain_samples is not None else (2000 if args.quick else 24000)
    seq_len = 32 if args.quick else 64
    with tempfile.TemporaryDirectory(prefix="p2ptrain-convergence-") as temp:
        cache_dir = args.cache_dir or Path(temp) / "cache"
        model, pretrained_loss = "tiny", None
        if pretrain_samples:
            print(f"pretraining the tiny preset on {pretrain_samples} samples", file=sys.stderr, flush=True)
            model = str(pretrained_model(pretrain_samples, 2 * args.micro_batch, seq_len, args.inner_lr, cache_dir))
            pretrained = build_model(model, seed=SEED)
            pretrained_loss = mean_loss(pretrained.model, validation_batches(DATASET, pretrained.tokenizer, seq_len, EVAL_BATCH,
                                                                              cache_dir, FINAL_EVAL_BATCHES))
        setup = Setup(total, args.micro_batch, seq_len, args.inner_lr, args.lr_schedule, args.outer_lr, args.outer_momentum,
                      cache_dir, Path(temp) / "peers", args.timeout, model, pretrained_loss, pretrain_samples,
                      args.error_feedback_decay)
        torch.set_num_threads(1)
        plans = [("diloco", h, "blockwise8bit") for h in args.local_steps] + [("sync", 1, "none")]
        plans.append(("diloco", args.local_steps[len(args.local_steps) // 2], "none"))
        plans += [("diloco", h, swarm.removeprefix("diloco-")) for swarm in args.swarms if swarm not in SWARMS
                  for h in args.local_steps]
        baselines = [("baseline", PEERS, ""), ("baseline", 1, "")] if "baselines" in args.swarms else []
        plans = baselines + [plan for plan in plans if f"{plan[0]}-{plan[2]}" in args.swarms]
        command = "nice -n 10 .venv/bin/python " + " ".join(["benchmarks/convergence.py"] + sys.argv[1:])
        results = [result for path in args.load for result in load_results(path)[0]]
        names = {result.name for result in results}
        plans = [plan for plan in plans if plan_name(setup, *plan) not in names]
        lock = threading.Lock()
        text = ""

        def run(plan: tuple[str, int, str]) -> None:
            nonlocal text
            mode, local_steps, compression = plan
            print(f"running {mode} H={local_steps} {compression}", file=sys.stderr, flush=True)
            began = time.monotonic()
            try:
                if mode == "baseline":
                    done = [run_single(setup, local_steps * setup.micro_batch)]
                else:
                    done = [run_swarm(setup, mode, local_steps, compression)]
            except RuntimeError as error:
                print(f"skipped {mode} H={local_steps}: {error}", file=sys.stderr, flush=True)
                return
            with lock:
                results.extend(done)
                print(f"{time.monotonic() - began:.0f} s:", json.dumps(done[-1].__dict__, default=str)[:400], file=sys.stderr, flush=True)
                # after every configuration, so a cut-short run still leaves its results
                if args.save:
                    save_results(args.save, setup, results, before)
                if any(result.order == PEERS * setup.micro_batch for result in results):
                    text = write_outputs(setup, results, command, started, args.out_dir)

        with ThreadPoolExecutor(max_workers=args.parallel) as pool:
            for future in [pool.submit(run, plan) for plan in plans]:
                future.result()
        if any(result.order == PEERS * setup.micro_batch for result in results):
            text = write_outputs(setup, results, command, started, args.out_dir)
    print(text)


if __name__ == "__main__":
    main()
