"""A training worker's process group: forming it, its stop signals, and ending it.

The worker leads its own process group so that the daemon (or the worker
itself) can end everything it started — the hivemind DHT process, averager
processes, and p2pd — at once. PR_SET_PDEATHSIG makes the kernel send SIGTERM
to the worker when the daemon dies, even by SIGKILL.

Two callers end a worker's group, with SIGTERM, a grace period, then SIGKILL:

- the daemon, from outside the group: ``kill_group`` signals the whole group
  at once with ``killpg``;
- the worker itself, past its stop deadline: ``kill_own_group`` cannot
  ``killpg`` its own group, so it signals every other member one by one and
  spares the caller, which exits right after.

A worker names itself ``WORKER_PROCESS_NAME`` (``/proc/PID/comm``), so a
daemon that looks at who computes on its GPU can tell another daemon's
training worker from the owner's own programs.

Imports neither torch nor hivemind (the daemon uses it); psutil only.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import signal
import sys
import time
from collections.abc import Callable

import psutil

logger = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
POLL_S = 0.05
KILL_WAIT_S = 2.0  # how long kill_group waits for the group to go after SIGKILL


WORKER_PROCESS_NAME = "p2ptrain-worker"


def name_this_process(name: str = WORKER_PROCESS_NAME) -> None:
    """Set this process's name as ``ps`` and ``/proc/PID/comm`` show it (at most 15 bytes; Linux only)."""
    try:
        with open("/proc/self/comm", "w") as comm:
            comm.write(name[:15])
    except OSError:
        pass  # not Linux, or /proc is not mounted: the name is cosmetic there


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


def dying_with_parent(sig: int = signal.SIGTERM):
    """A ``preexec_fn`` for ``subprocess.Popen``: in the child, between fork and exec, it asks the kernel to
    send ``sig`` to the child when the thread that started it ends, even by SIGKILL (``PR_SET_PDEATHSIG``,
    kept across exec). The C library is looked up here, in the parent: the child of a threaded process must
    do as little as it can. None where there is no ``prctl`` (not Linux)."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(PR_SET_PDEATHSIG, int(sig))


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


def group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` still has a member (zombies count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_group(pgid: int, grace_s: float = 0.0) -> None:
    """End process group ``pgid`` from outside it: SIGTERM the group, SIGKILL what is left after ``grace_s`` seconds.

    Args:
        pgid: the group to end; the caller's own group and pgids 0 and 1 are left alone.
        grace_s: how long the group may take to exit after SIGTERM; after
            SIGKILL it is given ``KILL_WAIT_S`` more.
    """
    if pgid <= 1 or pgid == os.getpgid(0):
        return
    _terminate_then_kill(
        lambda sig: os.killpg(pgid, sig),
        lambda timeout_s: _wait_until(lambda: not group_alive(pgid), timeout_s),
        grace_s, KILL_WAIT_S,
    )


def kill_own_group(pgid: int, grace_s: float = 3.0) -> None:
    """End the process group ``pgid`` the caller is in, sparing the caller, which should exit right after.

    Args:
        pgid: the caller's process group.
        grace_s: how long the others may take to exit after SIGTERM, and again after SIGKILL.
    """
    own_pid = os.getpid()
    others = [process for process in group_members(pgid) if process.pid != own_pid]
    terminate_processes(others, grace_s)
    _wait_until(lambda: not any(process.is_running() for process in others), grace_s)


def kill_descendants(grace_s: float = 3.0) -> None:
    """End every descendant of this process, wherever its process group is (p2pd may leave ours)."""
    terminate_processes(descendants(), grace_s)


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
    """SIGTERM ``processes``, wait up to ``grace_s``, then SIGKILL the rest and wait up to ``grace_s`` again.

    Waiting reaps those of them that are this process's children.
    """
    remaining = list(processes)

    def signal_remaining(sig: int) -> None:
        for process in remaining:
            try:
                process.send_signal(sig)
            except psutil.NoSuchProcess:
                pass

    def wait_remaining(timeout_s: float) -> bool:
        nonlocal remaining
        _, remaining = psutil.wait_procs(remaining, timeout=timeout_s)
        return not remaining

    _terminate_then_kill(signal_remaining, wait_remaining, grace_s, grace_s)


def _terminate_then_kill(send: Callable[[int], None], wait_gone: Callable[[float], bool], grace_s: float, kill_wait_s: float) -> None:
    """The escalation both ways of ending processes share.

    Args:
        send: sends a signal to every process still there; raises
            ProcessLookupError when there is none left.
        wait_gone: waits up to the given seconds for them all to exit; True if they did.
        grace_s: the wait after SIGTERM.
        kill_wait_s: the wait after SIGKILL.
    """
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, kill_wait_s)):
        try:
            send(sig)
        except ProcessLookupError:
            return
        if wait_gone(wait_s):
            return


def _wait_until(condition: Callable[[], bool], timeout_s: float) -> bool:
    """Poll ``condition`` until it holds or ``timeout_s`` seconds pass; returns its last value."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(POLL_S)
    return condition()
