"""Process-group, parent-death and signal helpers for the training worker.

The worker leads its own process group so that the daemon (or the worker
itself) can end everything it started — the hivemind DHT process, averager
processes, and p2pd — at once (``p2ptrain.processes`` ends the group).
PR_SET_PDEATHSIG makes the kernel send SIGTERM to the worker when the daemon
dies, even by SIGKILL.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import signal
import sys

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
