"""One slow volunteer beside two fast ones, equal wall-clock budget: fixed-H DiLoCo, DiLoCo whose
rounds end on the swarm's samples, and sync.

    sudo nice -n 10 .venv/bin/python benchmarks/heterogeneous.py [--minutes 5] [--fast-cores 0.5] [--slow-speed 0.25]

Three real workers on 127.0.0.1, started as the daemon starts them (convergence.py's
``Worker``), each in its own cgroup CPU quota (root; ``tests/cpu_quota.py``): the two
fast ones at ``--fast-cores`` of a core each, the slow one at ``--slow-speed`` times
that, so the speed ratio holds on a machine shared with other work as long as it has
the sum of the quotas free. All three train the ``tiny`` model from the same weights
on the stdlib corpus (seq_len 64, micro-batch 4, AdamW lr 3e-3) for ``--minutes`` after
every peer joined, then pause (a checkpoint each).

- ``diloco, fixed H``: ``round_end: local_steps``, H = ``--local-steps``;
- ``diloco, rounds on samples``: ``round_end: samples`` (the default), the same
  ``target_batch_size`` (3 peers x 4 x H);
- ``sync``: hivemind.Optimizer, ``target_batch_size`` ``--sync-batch``.

DiLoCo's outer step is plain averaging (outer lr 1, momentum 0: what convergence.py
found best on short runs). Reported per configuration: the validation loss of the
swarm's model (DiLoCo: the global parameters of each peer's checkpoint; sync: each
peer's parameters) on 256 fixed windows, mean over peers; the samples trained and
used (``contributed``: they entered an adopted average or optimizer step) and why
the rest was not; averaged rounds; and each peer's idle share: the time between
two batch computations while training (averaging, state downloads, waiting for the
others, epoch-end validation), over the budget. Writes ``heterogeneous_results.md``
and the raw results with the commit, date, machine and load to ``--out`` (default
``benchmarks/heterogeneous_<date>.json``), from which ``benchmarks/results.py`` renders
RESULTS.md's tables (``report``; mark them ``<!-- table: heterogeneous from FILE -->``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

import cpu_quota  # noqa: E402  (tests/cpu_quota.py)
from run_facts import facts  # noqa: E402
from convergence import DATASET, EVAL_BATCH, FINAL_EVAL_BATCHES, JOIN_TIMEOUT_S, SEED, Setup, Worker  # noqa: E402
from p2ptrain.peers.model.checkpoint import load_checkpoint  # noqa: E402
from p2ptrain.peers.model.models import build_model, mean_loss  # noqa: E402
from p2ptrain.peers.model.data import validation_batches  # noqa: E402

PEERS = ("fast0", "fast1", "slow")
MICRO_BATCH, SEQ_LEN, INNER_LR = 4, 64, 3e-3
MATCHMAKING_TIME = 3.0  # the product's default on 127.0.0.1 (peers.training.sync.LOCAL_AVERAGING)


def manifest_for(name: str, args, run_id: str) -> dict:
    manifest = {
        "run_id": run_id, "model": "tiny", "dataset": DATASET, "seq_len": SEQ_LEN, "micro_batch_hint": MICRO_BATCH,
        "inner_lr": INNER_LR, "outer_lr": 1.0, "outer_momentum": 0.0, "compression": "none", "seed": SEED,
        "created_at": time.time(), "local_steps": args.local_steps,
    }
    if name == "sync":
        return {**manifest, "mode": "sync", "target_batch_size": args.sync_batch}
    round_end = "local_steps" if name == "diloco, fixed H" else "samples"
    return {**manifest, "mode": "diloco", "round_end": round_end, "target_batch_size": len(PEERS) * MICRO_BATCH * args.local_steps}


def swarm_model_loss(checkpoint: dict, mode: str, windows: list) -> float:
    """The validation loss of the swarm's model as this peer holds it: DiLoCo's global parameters, sync's parameters."""
    loaded = build_model("tiny", seed=SEED)
    loaded.load_trainable_state(checkpoint["trainable"])
    if mode == "diloco":
        with torch.no_grad():
            for parameter, global_parameter in zip(loaded.trainable(), checkpoint["trainer"]["global_parameters"]):
                parameter.copy_(global_parameter)
    return mean_loss(loaded.model, windows)


def run_configuration(name: str, args, setup: Setup, windows: list) -> dict:
    """Three workers for ``args.minutes`` of training; the per-peer numbers of the result table."""
    run_id = f"hetero-{name.split(',')[0]}-{len(name)}-{os.getpid()}"
    manifest = manifest_for(name, args, run_id)
    quotas = {peer: cpu_quota.CpuQuota(args.fast_cores * (args.slow_speed if peer == "slow" else 1.0), name=f"p2ptrain-bench-{peer}")
              for peer in PEERS}
    workers: dict[str, Worker] = {}
    load_before = os.getloadavg()[0]
    try:
        for peer in PEERS:
            initial_peers = [workers["fast0"].of_type("joined")[0]["addresses"][0]] if workers else []
            workers[peer] = Worker(setup.work_dir / run_id / peer, peer, manifest, initial_peers, setup, MATCHMAKING_TIME)
            quotas[peer].add(workers[peer].process.pid)
            workers[peer].wait_joined(JOIN_TIMEOUT_S)
        for worker in workers.values():
            worker.conn.send({"cmd": "resume"})
        deadline = time.monotonic() + args.minutes * 60
        while time.monotonic() < deadline:
            time.sleep(0.5)
            for worker in workers.values():
                worker.drain()
                if not worker.process.is_alive():
                    raise RuntimeError(f"{name}: {worker.name} exited with {worker.process.exitcode}")
        for worker in workers.values():
            worker.conn.send({"cmd": "pause"})
            worker.pause_sent = True
        wait_until = time.monotonic() + 120
        while not all(worker.stopped() for worker in workers.values()) and time.monotonic() < wait_until:
            time.sleep(0.5)
            for worker in workers.values():
                worker.drain()
        checkpoints = {peer: load_checkpoint(worker.checkpoint) for peer, worker in workers.items()}
    finally:
        for worker in workers.values():
            worker.kill_group()
        for quota in quotas.values():
            quota.remove()
    load_after = os.getloadavg()[0]
    rows = []
    for peer, worker in workers.items():
        steps = worker.of_type("step")
        checkpoint = checkpoints[peer]
        rows.append({
            "peer": peer, "samples_per_second": sum(r["samples"] for r in steps) / (args.minutes * 60),
            "trained": checkpoint["trained_samples"], "contributed": checkpoint["contributed_samples"],
            "unused": checkpoint["unused_samples"], "rounds": len(worker.rounds()),
            "downloads": sum(1 for r in worker.of_type("event") if r["kind"] == "state-downloaded"),
            "idle_share": sum(r["idle_s"] for r in steps) / (args.minutes * 60),
            "longest_idle_s": max((r["longest_idle_s"] for r in steps), default=0.0),
            "epoch": checkpoint["epoch"], "eval_loss": swarm_model_loss(checkpoint, manifest["mode"], windows),
        })
    return {"name": name, "rows": rows, "load": (load_before, load_after)}


def markdown(results: list[dict], args, command: str) -> str:
    lines = [
        "# A slow peer beside two fast ones, equal wall-clock budget", "",
        f"Command: `{command}`.", "",
        f"Three workers on 127.0.0.1, the `tiny` model from the same random weights, stdlib corpus, seq_len {SEQ_LEN}, "
        f"micro-batch {MICRO_BATCH}, AdamW lr {INNER_LR} (DiLoCo's inner lr; outer lr 1.0, momentum 0), "
        f"{args.minutes:g} minutes of training each. CPU quotas: fast peers {args.fast_cores:g} of a core each, the slow "
        f"one {args.fast_cores * args.slow_speed:g} ({args.slow_speed:g}x). DiLoCo target_batch_size "
        f"{len(PEERS) * MICRO_BATCH * args.local_steps} (3 peers x {MICRO_BATCH} x H = {args.local_steps}); sync "
        f"target_batch_size {args.sync_batch}. Eval loss: the swarm's model as each peer holds it at the end (DiLoCo: its "
        f"global parameters), mean cross-entropy on {FINAL_EVAL_BATCHES * EVAL_BATCH} fixed validation windows; idle: time "
        "between two batch computations while training, over the budget.", "",
        "| configuration | eval loss (mean over peers) | samples used / trained (all peers) | slow peer: used / trained | "
        "slow peer: averaged rounds | idle share fast0, fast1 (longest idle) | 1-min load before, after |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for result in results:
        rows = {row["peer"]: row for row in result["rows"]}
        used, trained = sum(r["contributed"] for r in rows.values()), sum(r["trained"] for r in rows.values())
        slow = rows["slow"]
        idle = ", ".join(f"{rows[p]['idle_share']:.1%}" for p in ("fast0", "fast1"))
        longest = max(rows[p]["longest_idle_s"] for p in ("fast0", "fast1"))
        lines.append(
            f"| {result['name']} | {sum(r['eval_loss'] for r in rows.values()) / len(rows):.4f} | {used:,} / {trained:,} "
            f"({used / max(trained, 1):.0%}) | {slow['contributed']:,} / {slow['trained']:,} ({slow['contributed'] / max(slow['trained'], 1):.0%}) | "
            f"{slow['rounds']} | {idle} ({longest:.1f} s) | {result['load'][0]:.1f}, {result['load'][1]:.1f} |")
    lines += ["", "Per peer:", "", "| configuration | peer | samples/s | trained | used | unused: late, failed round, rejected | "
              "averaged rounds | state downloads | epoch | eval loss |", "|---|---|---:|---:|---:|---|---:|---:|---:|---:|"]
    for result in results:
        for row in result["rows"]:
            unused = row["unused"]
            lines.append(f"| {result['name']} | {row['peer']} | {row['samples_per_second']:.1f} | {row['trained']:,} | "
                         f"{row['contributed']:,} | {unused['late']}, {unused['failed_round']}, {unused['rejected']} | "
                         f"{row['rounds']} | {row['downloads']} | {row['epoch']} | {row['eval_loss']:.4f} |")
    return "\n".join(lines) + "\n"


def report(path: Path) -> str:
    """RESULTS.md's tables of an ``--out`` data file (``markdown`` without its title)."""
    data = json.loads(path.read_text())
    return markdown(data["results"], argparse.Namespace(**data["options"]), data["command"]).split("\n", 2)[2].strip()


def write_outputs(results: list[dict], args, command: str, before: dict) -> str:
    """``heterogeneous_results.md`` and the data file, after every configuration; returns the markdown."""
    text = markdown(results, args, command)
    (HERE / "heterogeneous_results.md").write_text(text)
    options = {key: value for key, value in vars(args).items() if key not in ("out", "report")}
    args.out.write_text(json.dumps({"benchmark": "heterogeneous", **before, "load_now": os.getloadavg(), "command": command,
                                    "options": options, "results": results}, indent=1) + "\n")
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="training time of each configuration")
    parser.add_argument("--fast-cores", type=float, default=0.5, help="CPU quota of each fast peer, in cores")
    parser.add_argument("--slow-speed", type=float, default=0.25, help="the slow peer's quota as a fraction of a fast one's")
    parser.add_argument("--local-steps", type=int, default=100, help="DiLoCo's H (fixed H; the round's sample target for both)")
    parser.add_argument("--sync-batch", type=int, default=240, help="sync's target_batch_size")
    parser.add_argument("--only", nargs="*", choices=["diloco, fixed H", "diloco, rounds on samples", "sync"],
                        default=["diloco, fixed H", "diloco, rounds on samples", "sync"])
    parser.add_argument("--out", type=Path, default=HERE / f"heterogeneous_{datetime.date.today()}.json",
                        help="the data file: results, commit, date, machine and load")
    parser.add_argument("--report", type=Path, help="print RESULTS.md's tables of this data file and exit")
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
        return
    reason = cpu_quota.unavailable()
    if reason:
        sys.exit(f"benchmarks/heterogeneous.py {reason}: run it as root on Linux")
    torch.set_num_threads(1)
    before = facts()
    command = "nice -n 10 .venv/bin/python " + " ".join(["benchmarks/heterogeneous.py"] + sys.argv[1:])
    results = []
    with tempfile.TemporaryDirectory(prefix="p2ptrain-heterogeneous-") as temp:
        setup = Setup(0, MICRO_BATCH, SEQ_LEN, INNER_LR, "constant", 1.0, 0.0, Path(temp) / "cache", Path(temp) / "peers", 0)
        windows = validation_batches(DATASET, build_model("tiny", seed=SEED).tokenizer, SEQ_LEN, EVAL_BATCH, setup.cache_dir, FINAL_EVAL_BATCHES)
        for name in args.only:
            print(f"running {name}", file=sys.stderr, flush=True)
            results.append(run_configuration(name, args, setup, windows))
            text = write_outputs(results, args, command, before)
            print(text, file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
