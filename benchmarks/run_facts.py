"""Where and under what load a benchmark ran: the facts every raw data row carries.

``facts()`` is the commit of the code measured, the date, the machine (CPU model, cores,
memory, torch) and the load average; never who ran it.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA_SUFFIXES = (".jsonl", ".md")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _commit() -> str:
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True, text=True, check=True).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=HERE, capture_output=True,
                                 text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    # the data files a benchmark appends its rows to are not the code measured
    dirty = [line for line in changed if not line.rstrip().endswith(DATA_SUFFIXES)]
    return commit + ("-dirty" if dirty else "")


def facts() -> dict:
    """``commit`` (``-dirty`` when tracked files other than benchmark data and results differ from it),
    ``date`` (UTC), ``machine`` and ``load`` (1, 5, 15 minutes)."""
    import torch

    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "commit": _commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu": _cpu_model(), "cores": os.cpu_count(), "memory_gib": round(memory_gib, 1),
                    "torch": torch.__version__, "python": platform.python_version()},
        "load": [round(value, 2) for value in os.getloadavg()],
    }


def read_rows(path: Path) -> list[dict]:
    """The raw rows of a benchmark's JSON-lines data file, in its order."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def append_row(path: Path | None, row: dict) -> None:
    """Print a benchmark's ``row`` as one JSON line, and append it to the data file ``path`` when given."""
    print(json.dumps(row), flush=True)
    if path:
        with path.open("a") as file:
            file.write(json.dumps(row) + "\n")
