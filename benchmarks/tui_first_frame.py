"""Time from starting ``p2ptrain-tui`` to its first screen showing the daemon's live state.

Runs the real app headless (Textual's test driver) against the tests' fake
daemon on a real Unix socket, in a fresh interpreter each time so that the
import cost is counted, and prints a table of the runs. The target is under
1 s on a volunteer's machine.

    .venv/bin/python benchmarks/tui_first_frame.py [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Measured inside the child: from interpreter start (before importing the TUI)
# to the first refresh of a screen that shows the daemon's state.
CHILD = r"""
import time
started = time.perf_counter()
import asyncio, sys
sys.path.insert(0, sys.argv[2])
from fake_daemon import FakeDaemon
from p2ptrain.tui.app import P2PTrainApp
from p2ptrain.tui.connection import find_daemon

async def measure():
    app = P2PTrainApp(find_daemon(sys.argv[1]), poll_interval_s=1.0)
    async with app.run_test(size=(120, 40)) as pilot:
        while app.state is None:
            await asyncio.sleep(0.005)
        await pilot.pause()
        return time.perf_counter() - started

with FakeDaemon(sys.argv[1]):
    print(f"{asyncio.run(measure()):.4f}")
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="fresh interpreters to time (default 5)")
    args = parser.parse_args()
    timings = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as home:
            output = subprocess.run(
                [sys.executable, "-c", CHILD, home, str(REPO / "tests" / "tui")],
                cwd=REPO, capture_output=True, text=True, check=True, timeout=60,
            ).stdout
        timings.append(float(output.strip().splitlines()[-1]))
    print("| run | first frame with live state (s) |")
    print("|---|---|")
    for number, seconds in enumerate(timings, 1):
        print(f"| {number} | {seconds:.3f} |")
    print(f"| median | {statistics.median(timings):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
