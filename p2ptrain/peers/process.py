"""Process-group, parent-death and signal helpers for the training worker.

The worker leads its own process group so that the daemon (or the worker
itself) can end everything it started — the hivemind DHT process, averager
processes, and p2pd — with one ``killpg``. PR_SET_PDEATHSIG makes the kernel
send SIGTERM to the worker when the daemon dies, even by SIGKILL.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import signal
import sys
import time

import psutil

logger = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1


def become_group_leader() -> int:
    """Make this process the leader of a new process group; return the group id."""
    try:
        os.setpgid(0, 0)
    except PermissionError:  # already a session leader: it leads its group anyway
        pass
    return os.getpgid(0)


def die_with_parent(sig: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent exits (Linux only).

    Returns True when the request was installed.
    """
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        logger.warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
        return False
    # the parent may have died before prctl: then we were re-parented already
    if os.getppid() == 1:
        os.kill(os.getpid(), sig)
    return True


def install_stop_handlers(handler) -> None:
    """Route SIGTERM and SIGINT to ``handler(signum, frame)``.

    hivemind's averagers set SIGINT to ignored when they start, so call this
    again after the optimizer and averagers are up.
    """
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def default_stop_handlers() -> None:
    """Give SIGTERM and SIGINT their default actions (for forked children of the worker)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def descendants(pid: int | None = None) -> list[psutil.Process]:
    """All live descendants of ``pid`` (default: this process)."""
    try:
        return psutil.Process(pid or os.getpid()).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def group_members(pgid: int) -> list[psutil.Process]:
    """Live processes whose process group is ``pgid``."""
    members = []
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                members.append(process)
        except (ProcessLookupError, psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return members


def terminate_processes(processes: list[psutil.Process], grace_s: float = 3.0) -> None:
    """SIGTERM ``processes``, wait up to ``grace_s``, then SIGKILL the rest."""
    for process in processes:
        try:
            process.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(processes, timeout=grace_s)
    for process in alive:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace_s)


def kill_group(pgid: int, grace_s: float = 3.0) -> None:
    """End a whole process group: SIGTERM, wait up to ``grace_s``, SIGKILL.

    Safe to call from inside the group: the caller is spared and should exit
    right after.
    """
    own_pid = os.getpid()
    others = [process for process in group_members(pgid) if process.pid != own_pid]
    terminate_processes(others, grace_s)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(p.is_running() for p in others):
        time.sleep(0.05)


def kill_descendants(grace_s: float = 3.0) -> None:
    """End every descendant of this process, wherever its process group is (p2pd may leave ours)."""
    terminate_processes(descendants(), grace_s)
