"""Samples/s of one daemon-run peer against a bare PyTorch loop, side by side; and join-to-first-sample time.

Both train the built-in `tiny` model on the built-in corpus, seq 128, micro-batch 8.
The bare loop runs first (in a subprocess, so it gets the same cores), then a real
`p2ptrain daemon` creates a `sync` run alone and trains; its rate is read from the
trained-samples counter of `p2ptrain status` over the measuring window.
Goal: ratio >= 0.97.

    .venv/bin/python benchmarks/peer_throughput.py [--seconds 60] [--out FILE.jsonl]
    .venv/bin/python benchmarks/peer_throughput.py --report FILE.jsonl

``--out`` appends one raw row (both rates, the join time, the commit, date, machine and
the load before and after); ``--report`` renders RESULTS.md's table from such a file.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from run_facts import facts, read_rows

from p2ptrain.demo import loopback_config
from p2ptrain.paths import resolve_paths
from p2ptrain.protocol import ControlClient, DaemonNotRunning


def bare_loop_samples_per_second(steps: int, cache_dir: Path) -> float:
    code = (
        "import sys, json; sys.path.insert(0, 'benchmarks');"
        "from bare_loop import measure_bare_loop;"
        f"print(json.dumps(measure_bare_loop({steps}, 128, 8, __import__('pathlib').Path({str(cache_dir)!r}))))"
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
        client.call("join", run="bench", new_run=True, manifest={"mode": "sync", "target_batch_size": 1_000_000, "micro_batch_hint": 8})
        _wait(client, lambda status: ((status.get("local") or {}).get("trained_samples") or 0) > 0, 300)
        first_sample_s = time.monotonic() - joined_at
        time.sleep(10)  # warm-up: caches, allocator, thread pools
        start = client.call("status")["local"]["trained_samples"]
        started = time.monotonic()
        time.sleep(seconds)
        end = client.call("status")["local"]["trained_samples"]
        rate = (end - start) / (time.monotonic() - started)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(120)
    return {"samples_per_second": rate, "join_to_first_sample_s": first_sample_s}


def report(path: Path) -> str:
    """RESULTS.md's table from the rows of ``path``: one line per run of the benchmark."""
    lines = ["| date (UTC) | commit | 1-min load before / after | bare PyTorch loop, samples/s | "
             "p2ptrain daemon peer (sync, alone), samples/s | ratio (goal >= 0.97) | join to first contributed sample |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for row in read_rows(path):
        met = "met" if row["ratio"] >= row["goal_ratio"] else "not met"
        lines.append(f"| {row['date'][:16].replace('T', ' ')} | {row['commit'][:7]} | "
                     f"{row['load_1min_before']:.2f} / {row['load_1min_after']:.2f} | {row['bare_loop_samples_per_second']:.1f} | "
                     f"{row['daemon_peer_samples_per_second']:.1f} | **{row['ratio']:.3f}** ({met}) | "
                     f"{row['join_to_first_contributed_sample_s']:.1f} s |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60, help="measuring window of the daemon peer")
    parser.add_argument("--steps", type=int, default=300, help="timed steps of the bare loop")
    parser.add_argument("--out", type=Path, help="append the raw row (JSON line) to this file")
    parser.add_argument("--report", type=Path, help="print RESULTS.md's table from this file and exit")
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
        return
    load_before = os.getloadavg()[0]
    root = Path(tempfile.mkdtemp(prefix="p2p-throughput-"))
    try:
        bare = bare_loop_samples_per_second(args.steps, root / "cache")
        peer = daemon_peer(args.seconds, root / "peer")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result = {
        "bare_loop_samples_per_second": round(bare, 1),
        "daemon_peer_samples_per_second": round(peer["samples_per_second"], 1),
        "ratio": round(peer["samples_per_second"] / bare, 3),
        "goal_ratio": 0.97,
        "join_to_first_contributed_sample_s": round(peer["join_to_first_sample_s"], 1),
        "seconds": args.seconds,
        "bare_loop_steps": args.steps,
        "load_1min_before": round(load_before, 2),
        "load_1min_after": round(os.getloadavg()[0], 2),
    }
    row = {**result, **{key: value for key, value in facts().items() if key != "load"}}
    print(json.dumps(row))
    if args.out:
        with args.out.open("a") as file:
            file.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
