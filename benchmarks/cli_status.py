"""Wall time of `p2ptrain status` against `python -c pass` on the same interpreter, side by side.

Starts a real daemon under a temporary home, then alternates the two commands
so that both see the same machine load. Goal: median ratio <= 2.0.

    .venv/bin/python benchmarks/cli_status.py [--runs 40] [--json]
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

from p2ptrain.paths import resolve_paths
from p2ptrain.protocol import ControlClient, DaemonNotRunning


def _time(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - started


def measure(runs: int) -> dict:
    """Median wall times (s) of both commands and their ratio, with a daemon answering."""
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
        for _ in range(runs):
            status_times.append(_time(status_command))
            baseline_times.append(_time(baseline_command))
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
        shutil.rmtree(home, ignore_errors=True)
    status_median, baseline_median = statistics.median(status_times), statistics.median(baseline_times)
    return {
        "runs": runs,
        "p2ptrain_status_s": round(status_median, 4),
        "python_pass_s": round(baseline_median, 4),
        "ratio": round(status_median / baseline_median, 2),
        "goal_ratio": 2.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure(args.runs)
    if args.json:
        print(json.dumps(result))
    else:
        print("| command | median wall time |\n|---|---|")
        print(f"| `python -c pass` | {result['python_pass_s'] * 1000:.1f} ms |")
        print(f"| `p2ptrain status` | {result['p2ptrain_status_s'] * 1000:.1f} ms |")
        print(f"\nratio {result['ratio']} (goal <= {result['goal_ratio']}), {result['runs']} runs each, alternated")


if __name__ == "__main__":
    main()
