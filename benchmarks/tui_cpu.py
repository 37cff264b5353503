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

    .venv/bin/python benchmarks/tui_cpu.py [--before f77d936] [--seconds 60] [--rounds 1] [--out FILE.jsonl]
    .venv/bin/python benchmarks/tui_cpu.py --report FILE.jsonl

Each round starts both TUIs afresh. Needs tmux (``apt-get install tmux``).
``--out`` appends one JSON line per invocation: every round's CPU seconds per
minute of both TUIs and both daemons, the seconds, the epochs, the before
revision (and its full commit), the load average just before the first round
and after the last, and the facts of the run (``run_facts.py``: this
checkout's commit, date, machine). ``--report`` renders RESULTS.md's round table
from that file (``results.py``: ``tui-cpu``).
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
sys.path.insert(0, str(REPO / "benchmarks"))

from tmux import TMUX, TmuxPane, tui_command  # noqa: E402

from p2ptrain.demo import loopback_config  # noqa: E402
from p2ptrain.paths import resolve_paths  # noqa: E402
from p2ptrain.protocol import ControlClient, DaemonNotRunning  # noqa: E402
from run_facts import facts  # noqa: E402

RUN = "tui-cpu"
# main before the TUI followed the daemon's pushed updates (it polled five methods every second).
DEFAULT_BEFORE = "f77d936"


def extract(revision: str, into: Path) -> Path:
    """The ``p2ptrain`` package of ``revision`` under ``into`` (``git archive``, no worktree)."""
    into.mkdir(parents=True)
    archive = into / "source.tar"
    with open(archive, "wb") as output:
        subprocess.run(["git", "-C", str(REPO), "archive", revision, "p2ptrain"], stdout=output, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into


def p2ptrain(source: Path, *args: str) -> list[str]:
    """``p2ptrain ARGS`` running the code under ``source``."""
    script = shutil.which("p2ptrain", path=os.path.dirname(sys.executable))
    command = [script] if script else [sys.executable, "-m", "p2ptrain.cli"]
    return ["env", f"PYTHONPATH={source}", *command, *args]


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


def start_training(source: Path, home: Path) -> subprocess.Popen:
    """A daemon of the code under ``source`` in a run of its own, its worker training."""
    home.mkdir(parents=True)
    (home / "config.toml").write_text(loopback_config())
    with open(home / "daemon.log", "w") as log:
        daemon = subprocess.Popen(p2ptrain(source, "daemon", "--home", str(home), "--log-level", "warning"), stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    wait_for(ControlClient(str(resolve_paths(home).socket)), lambda status: True, 60, "the daemon to answer")
    subprocess.run(p2ptrain(source, "join", "--new-run", RUN, "--target-batch-size", "64", "--home", str(home)),
                   check=True, capture_output=True)
    return daemon


def measure_round(homes: dict[str, Path], sources: dict[str, Path], daemons: dict[str, psutil.Process], seconds: float) -> dict:
    """Each TUI on its daemon, side by side for ``seconds``: CPU seconds per minute of the TUIs and the daemons
    (keys ``before TUI``, ``after TUI``, ``before daemon``, ``after daemon``; ``sources``' keys are before and after)."""
    panes = {name: TmuxPane(120, 40).open() for name in sources}
    try:
        for name, source in sources.items():
            panes[name].run(["env", f"PYTHONPATH={source}", *tui_command(homes[name])])
        for name, pane in panes.items():
            pane.wait_for(lambda screen: "TRAINING" in screen and RUN in screen, timeout=60, what=f"{name}: the run")
        time.sleep(5)  # both past their start (imports, first frames, the history)
        processes = {f"{name} TUI": psutil.Process(pane.pid) for name, pane in panes.items()}
        processes.update({f"{name} daemon": daemon for name, daemon in daemons.items()})
        started = time.monotonic()
        before = {name: cpu_seconds(process) for name, process in processes.items()}
        time.sleep(seconds)
        elapsed_min = (time.monotonic() - started) / 60
        result = {name: (cpu_seconds(process) - before[name]) / elapsed_min for name, process in processes.items()}
        for pane in panes.values():
            pane.send("q")
        for name, pane in panes.items():
            pane.wait_for(lambda _: pane.exited, timeout=30, what=f"{name}: the TUI to quit")
        return result
    finally:
        for pane in panes.values():
            pane.close()


def stop(daemon: subprocess.Popen) -> None:
    os.killpg(daemon.pid, signal.SIGTERM)
    try:
        daemon.wait(90)
    except subprocess.TimeoutExpired:
        os.killpg(daemon.pid, signal.SIGKILL)
        daemon.wait(10)


def render_run(row: dict) -> str:
    """One invocation's line of ``--out``: its facts and a row per round."""
    run_facts, before = row["facts"], row["before"]
    commit = run_facts["commit"][:7] + (" (with uncommitted changes)" if run_facts["commit"].endswith("-dirty") else "")
    loads = [", ".join(f"{value:.1f}" for value in row[key]) for key in ("load_before", "load_after")]
    lines = [f"{before} against {commit}, {run_facts['date'][:16].replace('T', ' ')} UTC, {run_facts['machine']['cores']} cores, "
             f"{row['seconds']:.0f} s a round after {row['epochs']} epoch{'s' if row['epochs'] != 1 else ''}; load average (1, 5, 15 min) {loads[0]} before the "
             f"first round, {loads[1]} after the last:", "",
             f"| round | {before}'s TUI (CPU s/min) | this TUI (CPU s/min) | this / {before} | {before}'s daemon (CPU s/min) | "
             "this daemon (CPU s/min) |", "|---|---:|---:|---:|---:|---:|"]
    for number, result in enumerate(row["rounds"], 1):
        lines.append(f"| {number} | {result['before TUI']:.2f} | {result['after TUI']:.2f} | "
                     f"**{result['after TUI'] / result['before TUI']:.2f}** | {result['before daemon']:.2f} | {result['after daemon']:.2f} |")
    return "\n".join(lines)


def report(path: Path) -> str:
    """Every invocation of ``path`` (``--out``) rendered by ``render_run``."""
    return "\n\n".join(render_run(json.loads(line)) for line in path.read_text().splitlines() if line.strip())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=DEFAULT_BEFORE, help=f"the git revision to compare with (default {DEFAULT_BEFORE})")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to measure each round (default 60)")
    parser.add_argument("--rounds", type=int, default=1, help="how many rounds (default 1)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs each daemon finishes before the TUIs start (default 3)")
    parser.add_argument("--out", type=Path, help="append the invocation's row (see the docstring) to this JSON-lines file")
    parser.add_argument("--report", type=Path, help="print the table of this file and exit")
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
        return 0
    if TMUX is None:
        print("tui_cpu: needs tmux for real terminals; install it (apt-get install tmux)", file=sys.stderr)
        return 2
    run_facts = facts()
    before_commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", args.before], capture_output=True, text=True,
                                   check=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="p2p-tui-cpu-") as directory:
        directory = Path(directory)
        sources = {"before": extract(args.before, directory / "before"), "after": REPO}
        homes = {name: directory / f"home-{index}" for index, name in enumerate(sources)}
        started: dict[str, subprocess.Popen] = {}
        try:
            for name in sources:
                started[name] = start_training(sources[name], homes[name])
            for name in sources:
                wait_for(ControlClient(str(resolve_paths(homes[name]).socket)),
                         lambda status: (status.get("run") or {}).get("epoch", 0) >= args.epochs, 900, f"{name}: epoch {args.epochs}")
            daemons = {name: psutil.Process(process.pid) for name, process in started.items()}
            load_before = os.getloadavg()
            rounds = [measure_round(homes, sources, daemons, args.seconds) for _ in range(args.rounds)]
            load_after = os.getloadavg()
        finally:
            for daemon in started.values():
                stop(daemon)
    row = {"before": args.before, "before_commit": before_commit, "seconds": args.seconds, "epochs": args.epochs,
           "rounds": rounds, "load_before": [round(value, 2) for value in load_before],
           "load_after": [round(value, 2) for value in load_after], "facts": run_facts}
    if args.out:
        with args.out.open("a") as output:
            output.write(json.dumps(row) + "\n")
    print(render_run(row))
    print(f"\ncommand: {shlex.join(['python', *sys.argv])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
