"""CPU the TUI uses per minute while it shows a training daemon: an older p2ptrain's TUI and this one, side by side.

Two versions side by side, at the same time on the same machine: the p2ptrain
of ``--before`` (a git revision, extracted to a temporary directory) and this
checkout. Each runs its own real daemon under a temporary home (127.0.0.1
only) with a sync run of the built-in tiny model alone, so each TUI gets what
its own daemon sends (the older daemon pushed status only on a state change;
pushing more would make the older TUI poll more). Once both daemons have
finished a few epochs, it starts each version's ``p2ptrain-tui`` in a real
terminal (a 120x40 tmux pane), and once both show their run, reads each TUI's
process CPU time (user + system, psutil) at the start and the end of
``--seconds``. Prints the CPU seconds per minute of each TUI, their ratio
(goal: after <= half of before), each daemon's CPU per minute over the same
window, and the load average (the machine may be shared).

    .venv/bin/python benchmarks/tui_cpu.py [--before f77d936] [--seconds 60] [--rounds 1]

Each round starts both TUIs afresh. Needs tmux (``apt-get install tmux``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "tui"))

from tmux import TMUX, TmuxPane, tui_command  # noqa: E402

from p2ptrain.paths import resolve_paths  # noqa: E402
from p2ptrain.protocol import ControlClient, DaemonNotRunning  # noqa: E402

RUN = "tui-cpu"
# main before the TUI followed the daemon's pushed updates (it polled five methods every second).
DEFAULT_BEFORE = "f77d936"
CONFIG = """\
nickname = "tui-cpu"
[dht]
host_maddrs = ["/ip4/127.0.0.1/tcp/0"]
use_relay = false
use_auto_relay = false
[policy]
max_cpu_threads = 1
"""


def extract(revision: str, into: Path) -> Path:
    """The ``p2ptrain`` package of ``revision`` under ``into`` (``git archive``, no worktree)."""
    archive = into / "source.tar"
    with open(archive, "wb") as output:
        subprocess.run(["git", "-C", str(REPO), "archive", revision, "p2ptrain"], stdout=output, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into


def p2ptrain(*args: str) -> list[str]:
    script = shutil.which("p2ptrain", path=os.path.dirname(sys.executable))
    return [script, *args] if script else [sys.executable, "-m", "p2ptrain.cli", *args]


def wait_for(client: ControlClient, predicate, timeout: float, what: str) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            status = client.call("status")
            if predicate(status):
                return status
        except (DaemonNotRunning, OSError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def measure_round(home: Path, sources: dict[str, Path], seconds: float, daemon: psutil.Process) -> dict:
    """Both TUIs side by side for ``seconds``; CPU seconds per minute of each and of the daemon."""
    panes = {name: TmuxPane(120, 40).open() for name in sources}
    try:
        for name, source in sources.items():
            panes[name].run(["env", f"PYTHONPATH={source}", *tui_command(home)])
        for name, pane in panes.items():
            pane.wait_for(lambda screen: "TRAINING" in screen and RUN in screen, timeout=60, what=f"{name}: the run")
        time.sleep(5)  # both past their start (imports, first frames, the history)
        processes = {name: psutil.Process(pane.pid) for name, pane in panes.items()}
        started = time.monotonic()
        before = {name: cpu_seconds(process) for name, process in processes.items()}
        daemon_before = cpu_seconds(daemon)
        time.sleep(seconds)
        elapsed_min = (time.monotonic() - started) / 60
        result = {name: (cpu_seconds(process) - before[name]) / elapsed_min for name, process in processes.items()}
        result["daemon"] = (cpu_seconds(daemon) - daemon_before) / elapsed_min
        for pane in panes.values():
            pane.send("q")
        for name, pane in panes.items():
            pane.wait_for(lambda _: pane.exited, timeout=30, what=f"{name}: the TUI to quit")
        return result
    finally:
        for pane in panes.values():
            pane.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=DEFAULT_BEFORE, help=f"the git revision to compare with (default {DEFAULT_BEFORE})")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to measure each round (default 60)")
    parser.add_argument("--rounds", type=int, default=1, help="how many rounds (default 1)")
    parser.add_argument("--json", action="store_true", help="print the rounds as JSON too")
    args = parser.parse_args()
    if TMUX is None:
        print("tui_cpu: needs tmux for real terminals; install it (apt-get install tmux)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="p2p-tui-cpu-") as directory:
        directory = Path(directory)
        home = directory / "home"
        home.mkdir()
        (home / "config.toml").write_text(CONFIG)
        sources = {f"before ({args.before})": extract(args.before, directory / "before"), "after (this checkout)": REPO}
        with open(directory / "daemon.log", "w") as log:
            daemon = subprocess.Popen(p2ptrain("daemon", "--home", str(home), "--log-level", "warning"), stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        try:
            client = ControlClient(str(resolve_paths(home).socket), timeout=10)
            wait_for(client, lambda status: True, 60, "the daemon to answer")
            subprocess.run(p2ptrain("join", "--new-run", RUN, "--target-batch-size", "64", "--home", str(home)),
                           check=True, capture_output=True)
            wait_for(client, lambda status: (status.get("run") or {}).get("epoch", 0) >= 3, 600, "epoch 3")
            load_before = os.getloadavg()
            rounds = [measure_round(home, sources, args.seconds, psutil.Process(daemon.pid)) for _ in range(args.rounds)]
            load_after = os.getloadavg()
        finally:
            os.killpg(daemon.pid, signal.SIGTERM)
            try:
                daemon.wait(90)
            except subprocess.TimeoutExpired:
                os.killpg(daemon.pid, signal.SIGKILL)
    names = list(sources)
    print(f"| round | {' | '.join(f'{name}: CPU s/min' for name in names)} | after / before | daemon CPU s/min |")
    print("|---|" + "---|" * (len(names) + 2))
    for number, result in enumerate(rounds, 1):
        ratio = result[names[1]] / result[names[0]] if result[names[0]] else float("nan")
        print(f"| {number} | {' | '.join(f'{result[name]:.2f}' for name in names)} | {ratio:.2f} | {result['daemon']:.2f} |")
    print(f"\n{args.seconds:.0f} s a round; load average (1, 5, 15 min) {', '.join(f'{x:.2f}' for x in load_before)} before, "
          f"{', '.join(f'{x:.2f}' for x in load_after)} after ({os.cpu_count()} cores)")
    print(f"command: {shlex.join([Path(sys.executable).name, *sys.argv])}")
    if args.json:
        print(json.dumps(rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
