"""Ending process groups and process trees: SIGTERM, a grace period, SIGKILL.

Two callers end a training worker's process group (the worker, its DHT
process, averagers and p2pd):

- the daemon, from outside the group: ``kill_group`` signals the whole group
  at once with ``killpg``;
- the worker itself, past its stop deadline: ``kill_own_group`` cannot
  ``killpg`` its own group, so it signals every other member one by one and
  spares the caller, which exits right after.

Imports neither torch nor hivemind (the daemon uses it); psutil only.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

import psutil

POLL_S = 0.05
KILL_WAIT_S = 2.0  # how long kill_group waits for the group to go after SIGKILL


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
