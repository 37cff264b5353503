"""Samples/s of one daemon-run peer against a bare PyTorch loop, side by side; and join-to-first-sample time.

Both train the built-in `tiny` model on the built-in corpus, seq 128. A real
`p2ptrain daemon` creates a `sync` run alone and trains; its rate is read from the
trained-samples counter of `p2ptrain status` over the measuring window. The worker
picks its own micro-batch (the hardware plan calibrates it), so the bare loop then
runs in a subprocess at that same micro-batch and on the same cores. The lone
peer's epoch (its target batch) is out of reach in the window, so it only
accumulates gradients; the bare loop does the same (forward, backward, no
optimizer step). The ratio is what the daemon, hivemind and p2pd cost per sample,
not what the plan gains. Rounds alternate
(peer, bare loop, peer, bare loop...) so that both see the same machine load; the
ratio is of the medians. Goal: ratio >= 0.97.

    .venv/bin/python benchmarks/peer_throughput.py [--seconds 45] [--rounds 3] [--out FILE.jsonl]
    .venv/bin/python benchmarks/peer_throughput.py --report FILE.jsonl

``--out`` appends one raw row (every round's rates, micro-batch and join time, the
commit, date, machine and the load before and after); ``--report`` renders
RESULTS.md's table from such a file.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from run_facts import facts, read_rows

from p2ptrain.demo import loopback_config
from p2ptrain.paths import resolve_paths
from p2ptrain.protocol import ControlClient, DaemonNotRunning

SEQ_LEN = 128
GOAL_RATIO = 0.97


def bare_loop_samples_per_second(steps: int, micro_batch: int, cache_dir: Path) -> float:
    """Samples/s of ``steps`` timed steps of ``benchmarks/bare_loop.py`` at ``micro_batch``, gradients accumulating
    with no optimizer step (as the lone sync peer's), in a subprocess."""
    code = (
        f"import sys, json; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r});"
        "from bare_loop import measure_bare_loop;"
        f"print(json.dumps(measure_bare_loop({steps}, {SEQ_LEN}, {micro_batch}, __import__('pathlib').Path({str(cache_dir)!r}), 0)))"
    )
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return float(output.strip().splitlines()[-1])


def _wait(client: ControlClient, predicate, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            status = client.call("status")
            if predicate(status):
                return status
        except (DaemonNotRunning, OSError):
            pass
        time.sleep(0.2)
    raise TimeoutError("the daemon did not get there in time")


def daemon_peer(seconds: float, home: Path) -> dict:
    """One daemon under ``home`` creating a lone sync run: its samples/s over ``seconds``, its micro-batch and
    torch threads (the plan's), and the seconds from ``join`` to its first trained sample."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(loopback_config(cpu_threads=None))
    daemon = subprocess.Popen(
        [sys.executable, "-m", "p2ptrain.cli", "daemon", "--home", str(home), "--log-level", "warning"],
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        client = ControlClient(str(resolve_paths(home).socket), timeout=10)
        _wait(client, lambda status: True, 60)
        joined_at = time.monotonic()
        # A large target batch: the lone peer trains without an averaging round inside the window.
        client.call("join", run="bench", new_run=True, manifest={"mode": "sync", "target_batch_size": 1_000_000,
                                                                  "micro_batch_hint": 8, "seq_len": SEQ_LEN})
        status = _wait(client, lambda status: ((status.get("local") or {}).get("trained_samples") or 0) > 0, 300)
        first_sample_s = time.monotonic() - joined_at
        time.sleep(10)  # warm-up: caches, allocator, thread pools
        start = client.call("status")["local"]["trained_samples"]
        started = time.monotonic()
        time.sleep(seconds)
        status = client.call("status")
        rate = (status["local"]["trained_samples"] - start) / (time.monotonic() - started)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(120)
    worker = status["local"]["workers"][0]
    return {"samples_per_second": rate, "join_to_first_sample_s": first_sample_s, "micro_batch": worker["micro_batch"],
            "cpu_threads": (worker.get("plan") or {}).get("cpu_threads")}


def measure(seconds: float, steps: int, rounds: int, root: Path) -> dict:
    """``rounds`` alternations of the daemon peer and the bare loop at the peer's micro-batch; medians and ratio."""
    peers, bares = [], []
    for number in range(rounds):
        peer = daemon_peer(seconds, root / f"peer{number}")  # a fresh home: a restarted daemon would resume the run
        peers.append({key: round(value, 2) if isinstance(value, float) else value for key, value in peer.items()})
        bares.append(round(bare_loop_samples_per_second(steps, peer["micro_batch"], root / "cache"), 2))
    peer_median = statistics.median(peer["samples_per_second"] for peer in peers)
    bare_median = statistics.median(bares)
    return {
        "rounds": rounds, "seconds": seconds, "bare_loop_steps": steps, "seq_len": SEQ_LEN,
        "peer_rounds": peers, "bare_loop_samples_per_second_rounds": bares,
        "daemon_peer_samples_per_second": round(peer_median, 1), "bare_loop_samples_per_second": round(bare_median, 1),
        "ratio": round(peer_median / bare_median, 3), "goal_ratio": GOAL_RATIO,
        "join_to_first_contributed_sample_s": peers[0]["join_to_first_sample_s"],
    }


def report(path: Path) -> str:
    """RESULTS.md's table from the rows of ``path``: one line per run of the benchmark."""
    lines = ["| date (UTC) | commit | 1-min load before / after | rounds | micro-batch (the plan's) | "
             "bare PyTorch loop, samples/s (median; each round) | p2ptrain daemon peer (sync, alone), samples/s (median; each round) | "
             "ratio (goal >= 0.97) | join to first trained sample (first round) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in read_rows(path):
        met = "met" if row["ratio"] >= row["goal_ratio"] else "not met"
        peers = row["peer_rounds"]
        batches = sorted({peer["micro_batch"] for peer in peers})
        peer_rates = ", ".join(f"{peer['samples_per_second']:.1f}" for peer in peers)
        bare_rates = ", ".join(f"{value:.1f}" for value in row["bare_loop_samples_per_second_rounds"])
        lines.append(f"| {row['date'][:16].replace('T', ' ')} | {row['commit'][:7]} | "
                     f"{row['load_1min_before']:.2f} / {row['load_1min_after']:.2f} | {row['rounds']} | "
                     f"{', '.join(str(batch) for batch in batches)} | {row['bare_loop_samples_per_second']:.1f} "
                     f"({bare_rates}) | {row['daemon_peer_samples_per_second']:.1f} ({peer_rates}) | "
                     f"**{row['ratio']:.3f}** ({met}) | {row['join_to_first_contributed_sample_s']:.1f} s |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=45, help="measuring window of the daemon peer, each round")
    parser.add_argument("--steps", type=int, default=300, help="timed steps of the bare loop, each round")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the peer and the bare loop (default 3)")
    parser.add_argument("--out", type=Path, help="append the raw row (JSON line) to this file")
    parser.add_argument("--report", type=Path, help="print RESULTS.md's table from this file and exit")
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
        return
    if args.rounds < 1:
        parser.error("--rounds must be at least 1, e.g. --rounds 3")
    load_before = os.getloadavg()[0]
    root = Path(tempfile.mkdtemp(prefix="p2p-throughput-"))
    try:
        result = measure(args.seconds, args.steps, args.rounds, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    row = {**result, "load_1min_before": round(load_before, 2), "load_1min_after": round(os.getloadavg()[0], 2),
           **{key: value for key, value in facts().items() if key != "load"}}
    print(json.dumps(row))
    if args.out:
        with args.out.open("a") as file:
            file.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
