"""Run a network-lab benchmark once per setting and keep one raw data row each (``wan.py``, ``scale.py``).

Each row is what the benchmark measured plus the commit, date and machine
(``run_facts.py``; the load is the benchmark's own, taken when it measured),
printed as a JSON line and appended to the ``--json`` file. A SIGTERM ends the
benchmark as Ctrl-C does: its lab's daemons and namespaces are torn down (before,
they stayed until ``tests/netlab/lab.remove_stale_labs()``).
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Callable, Iterable

from lab import lab_unavailable, remove_stale_labs
from run_facts import facts


def measure_each(settings: Iterable, measure: Callable[[object, Path], dict], json_path: Path | None, prefix: str) -> int:
    """``measure(setting, root)`` for each setting, in a fresh temporary ``root``; returns the exit code.

    Args:
        settings: what to measure, one lab each (modes, swarm sizes...).
        measure: builds its lab under ``root`` (daemon homes), measures, tears it down, returns the row.
        json_path: append each row here as a JSON line (None: print only).
        prefix: the temporary directory's name prefix.

    Returns:
        0, or 2 (with the reason on stderr) where no lab can be built here.
    """
    reason = lab_unavailable()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    remove_stale_labs()
    # SystemExit in the main thread, so each measure's `finally` ends its lab
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    root = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        for setting in settings:
            measured = facts()  # commit, date and machine; the row's load is the benchmark's, at its end
            row = {**measure(setting, root), **{key: value for key, value in measured.items() if key != "load"}}
            print(json.dumps(row), flush=True)
            if json_path:
                with json_path.open("a") as file:
                    file.write(json.dumps(row) + "\n")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def end_lab(lab, daemons: Iterable) -> None:
    """Stop every daemon of a benchmark's lab (SIGTERM, then SIGKILL after 60 s), then tear the lab down."""
    for daemon in daemons:
        daemon.terminate(timeout=60)
        daemon.kill()
    lab.teardown()
