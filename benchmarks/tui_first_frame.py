"""Time from starting ``p2ptrain-tui`` to its first screen showing the daemon's live state.

Starts the tests' fake daemon (the real control protocol on a real Unix socket,
in its own process, serving a run named ``tiny-demo`` in the ``training``
state), then, for each run, starts the real ``p2ptrain-tui`` in a real
terminal (a 120x40 tmux pane) and reads the screen every 10 ms until it
shows both ``training`` and ``tiny-demo``. The time counts the interpreter's
start and every import. The target is under 1 s. Prints the raw row: every
start's wall-clock seconds and the CPU seconds the TUI had used by then, the
commit, date, machine and the load before and after (the machine may be shared).

    .venv/bin/python benchmarks/tui_first_frame.py [--runs 7] [--out FILE.jsonl]
    .venv/bin/python benchmarks/tui_first_frame.py --report FILE.jsonl

``--out`` appends the row to a file; ``--report`` renders RESULTS.md's table from one.

Needs tmux (``apt-get install tmux``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "tui"))

from run_facts import facts, read_rows  # noqa: E402
from tmux import TMUX, TmuxPane, tui_command  # noqa: E402

from p2ptrain.paths import resolve_paths  # noqa: E402
from p2ptrain.protocol import ControlClient, DaemonNotRunning  # noqa: E402


def wait_for_daemon(home: str, timeout: float = 30) -> None:
    client = ControlClient(str(resolve_paths(home).socket), timeout=5)
    deadline = time.monotonic() + timeout
    while True:
        try:
            client.call("status")
            return
        except (DaemonNotRunning, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def shows_live_state(screen: str) -> bool:
    return "training" in screen and "tiny-demo" in screen


def time_one_start(home: str) -> tuple[float, float]:
    """Seconds from starting the TUI in a fresh tmux pane to the live state on its screen.

    Returns the wall-clock seconds and the CPU seconds the TUI used until then
    (less sensitive to other work on the machine).
    """
    with TmuxPane(120, 40) as pane:
        started = time.monotonic()
        pane.run(tui_command(home))
        pane.wait_for(shows_live_state, timeout=60, interval=0.01, what="training and tiny-demo")
        seconds = time.monotonic() - started
        cpu = psutil.Process(pane.pid).cpu_times()
        pane.send("q")
        pane.wait_for(lambda _: pane.exited, timeout=30, what="the TUI to quit")
    return seconds, cpu.user + cpu.system


def report(path: Path) -> str:
    """RESULTS.md's table from the rows of ``path``: one line per run of the benchmark."""
    lines = ["| date (UTC) | commit | 1-min load before / after | starts | first frame, wall: median (min–max) | "
             "CPU used by then: median (min–max) | goal < 1 s |", "|---|---|---:|---:|---:|---:|---:|"]
    for row in read_rows(path):
        walls, cpus = row["wall_s"], row["cpu_s"]
        wall = statistics.median(walls)
        lines.append(f"| {row['date'][:16].replace('T', ' ')} | {row['commit'][:7]} | "
                     f"{row['load_1min_before']:.2f} / {row['load_1min_after']:.2f} | {len(walls)} | "
                     f"**{wall:.2f} s** ({min(walls):.2f}–{max(walls):.2f}) | "
                     f"{statistics.median(cpus):.2f} s ({min(cpus):.2f}–{max(cpus):.2f}) | {'met' if wall < 1 else 'not met'} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="TUI starts to time (default 7)")
    parser.add_argument("--out", type=Path, help="append the raw row (JSON line) to this file")
    parser.add_argument("--report", type=Path, help="print RESULTS.md's table from this file and exit")
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
        return 0
    if args.runs < 1:
        parser.error("--runs must be at least 1, e.g. --runs 7")
    if TMUX is None:
        print("tui_first_frame: needs tmux for a real terminal; install it (apt-get install tmux)", file=sys.stderr)
        return 2
    timings = []
    with tempfile.TemporaryDirectory() as home:
        fake_daemon = subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "tui" / "fake_daemon.py"), "daemon", "--home", home]
        )
        try:
            wait_for_daemon(home)
            load_before = os.getloadavg()[0]
            for _ in range(args.runs):
                timings.append(time_one_start(home))
            load_after = os.getloadavg()[0]
        finally:
            fake_daemon.terminate()
            fake_daemon.wait(30)
    row = {"wall_s": [round(wall, 3) for wall, _ in timings], "cpu_s": [round(cpu, 3) for _, cpu in timings],
           "load_1min_before": round(load_before, 2), "load_1min_after": round(load_after, 2),
           **{key: value for key, value in facts().items() if key != "load"}}
    print(json.dumps(row))
    if args.out:
        with args.out.open("a") as file:
            file.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
