"""A CPU quota for a process and everything it starts later: a slow volunteer on this machine.

``CpuQuota(fraction)`` makes a cgroup whose processes together get ``fraction``
of one core (CFS bandwidth: ``fraction`` x period of CPU time per period), in
the cgroup v1 ``cpu`` hierarchy (``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``)
or in cgroup v2 (``cpu.max``), whichever this machine has with the cpu
controller. It needs root; ``unavailable()`` says why it cannot be used here
(for ``pytest.skip``). Children forked or spawned after ``add(pid)`` land in the
cgroup too. ``remove()`` deletes it once its processes are gone.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

PERIOD_US = 100_000
V1_CPU = Path("/sys/fs/cgroup/cpu")


def _v2_root() -> Path | None:
    """The cgroup v2 mount whose root offers the cpu controller, if any."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in mounts:
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "cgroup2":
            root = Path(fields[1])
            try:
                if "cpu" in (root / "cgroup.controllers").read_text().split():
                    return root
            except OSError:
                continue
    return None


def unavailable() -> str | None:
    """Why a CPU quota cannot be set on this machine, or None when it can."""
    if os.geteuid() != 0:
        return "needs root to create a cgroup with a CPU quota"
    if (V1_CPU / "cpu.cfs_quota_us").exists() or _v2_root() is not None:
        return None
    return "no cgroup v1 cpu hierarchy and no cgroup v2 with the cpu controller on this machine"


class CpuQuota:
    """A cgroup that gives its processes ``fraction`` of one core (see the module doc)."""

    def __init__(self, fraction: float, name: str = "p2ptrain-slow-peer"):
        reason = unavailable()
        if reason:
            raise RuntimeError(reason)
        quota_us = max(1000, int(fraction * PERIOD_US))
        name = f"{name}-{uuid.uuid4().hex[:8]}"
        if (V1_CPU / "cpu.cfs_quota_us").exists():
            self.path = V1_CPU / name
            self.path.mkdir()
            (self.path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (self.path / "cpu.cfs_quota_us").write_text(str(quota_us))
        else:
            root = _v2_root()
            # a child cgroup gets the cpu controller only if its parent hands it down
            (root / "cgroup.subtree_control").write_text("+cpu")
            self.path = root / name
            self.path.mkdir()
            (self.path / "cpu.max").write_text(f"{quota_us} {PERIOD_US}")

    def add(self, pid: int) -> None:
        """Move process ``pid`` into the cgroup (its later children follow it)."""
        (self.path / "cgroup.procs").write_text(str(pid))

    def pids(self) -> list[int]:
        try:
            return [int(line) for line in (self.path / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def throttled_periods(self) -> int:
        """How many CFS periods the quota held the cgroup's processes back (``nr_throttled``)."""
        for line in (self.path / "cpu.stat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "nr_throttled":
                return int(value)
        return 0

    def remove(self, timeout: float = 10.0) -> None:
        """Delete the cgroup, waiting up to ``timeout`` for its processes to be gone."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cgroup {self.path} still holds processes {self.pids()}") from None
                time.sleep(0.2)
