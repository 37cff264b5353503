"""Wall time of `p2ptrain status` against `python -c pass` on the same interpreter, side by side.

Starts a real daemon under a temporary home, then alternates the two commands
so that both see the same machine load. Goal: median ratio <= 2.0.

    .venv/bin/python benchmarks/cli_status.py [--runs 40] [--out FILE.jsonl]
    .venv/bin/python benchmarks/cli_status.py --report FILE.jsonl

By default the package's bytecode is compiled first, as ``pip install`` does for a
user's install; ``--no-bytecode`` times the command compiled from source on every
call (an editable checkout under ``PYTHONDONTWRITEBYTECODE``).
``--out`` appends one raw row (every timing, the commit, date, machine and the
load before and after); ``--report`` renders RESULTS.md's table from such a file.
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

from p2ptrain.paths import resolve_paths
from p2ptrain.protocol import ControlClient, DaemonNotRunning

GOAL_RATIO = 2.0


def _time(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - started


def compile_package() -> None:
    """Write the package's bytecode beside its sources, as ``pip install`` does."""
    import p2ptrain

    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.dirname(p2ptrain.__file__)], check=True)


def measure(runs: int, bytecode: bool) -> dict:
    """Median wall times (s) of both commands and their ratio, with a daemon answering.

    Args:
        runs: how many times each command runs, alternated.
        bytecode: whether the package's bytecode was compiled first (recorded in the row).
    """
    home = Path(tempfile.mkdtemp(prefix="p2p-bench-"))
    script = shutil.which("p2ptrain", path=os.path.dirname(sys.executable)) or "p2ptrain"
    daemon = subprocess.Popen([script, "daemon", "--home", str(home), "--log-level", "warning"], stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        client = ControlClient(str(resolve_paths(home).socket))
        for _ in range(100):
            try:
                client.call("status")
                break
            except (DaemonNotRunning, OSError):
                time.sleep(0.1)
        status_command = [script, "status", "--home", str(home)]
        baseline_command = [sys.executable, "-c", "pass"]
        for _ in range(3):  # warm the page cache for both
            _time(status_command), _time(baseline_command)
        status_times, baseline_times = [], []
        load_before = os.getloadavg()[0]
        for _ in range(runs):
            status_times.append(_time(status_command))
            baseline_times.append(_time(baseline_command))
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
        shutil.rmtree(home, ignore_errors=True)
    load_after = os.getloadavg()[0]
    status_median, baseline_median = statistics.median(status_times), statistics.median(baseline_times)
    return {
        "runs": runs,
        "package_bytecode": bytecode,
        "p2ptrain_status_s": round(status_median, 4),
        "python_pass_s": round(baseline_median, 4),
        "ratio": round(status_median / baseline_median, 2),
        "goal_ratio": GOAL_RATIO,
        "status_times_s": [round(value, 4) for value in status_times],
        "python_pass_times_s": [round(value, 4) for value in baseline_times],
        "load_1min_before": round(load_before, 2),
        "load_1min_after": round(load_after, 2),
    }


def report(path: Path) -> str:
    """RESULTS.md's table from the rows of ``path``: one line per run of the benchmark."""
    lines = ["| date (UTC) | commit | package bytecode | 1-min load before / after | runs each | `python -c pass` median | "
             "`p2ptrain status` median | ratio (goal <= 2.0) |", "|---|---|---|---:|---:|---:|---:|---:|"]
    for row in read_rows(path):
        met = "met" if row["ratio"] <= row["goal_ratio"] else "not met"
        lines.append(f"| {row['date'][:16].replace('T', ' ')} | {row['commit'][:7]} | "
                     f"{'compiled (as pip installs it)' if row['package_bytecode'] else 'none (compiled on every call)'} | "
                     f"{row['load_1min_before']:.2f} / {row['load_1min_after']:.2f} | {row['runs']} | "
                     f"{row['python_pass_s'] * 1000:.1f} ms | {row['p2ptrain_status_s'] * 1000:.1f} ms | "
                     f"**{row['ratio']:.2f}** ({met}) |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--no-bytecode", action="store_true",
                        help="do not compile the package's bytecode first (time it compiled from source on every call)")
    parser.add_argument("--out", type=Path, help="append the raw row (JSON line) to this file")
    parser.add_argument("--report", type=Path, help="print RESULTS.md's table from this file and exit")
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
        return
    if not args.no_bytecode:
        compile_package()
    result = measure(args.runs, bytecode=not args.no_bytecode)
    row = {**result, **{key: value for key, value in facts().items() if key != "load"}}
    print(json.dumps(row))
    if args.out:
        with args.out.open("a") as file:
            file.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
