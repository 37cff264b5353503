"""Which daemon the TUI talks to, and how to start one when none answers.

With ``--home`` (or ``P2PTRAIN_HOME``) there is exactly one socket. Without,
the TUI prefers the user daemon's socket and falls back to the system
service's, the same order the CLI uses.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from p2ptrain.paths import Paths, resolve_paths


@dataclass(frozen=True)
class DaemonTarget:
    """Where the daemon should listen, and the commands that start one there.

    Args:
        socket: the control socket to connect to.
        paths: the installation the socket belongs to (for logs and ``--home``).
        start_command: what a person types to start that daemon.
        can_start: True when the TUI may start it itself (a user daemon, not the
            system service, which belongs to systemd).
    """

    socket: Path
    paths: Paths
    start_command: str
    can_start: bool


def find_daemon(home: str | os.PathLike | None = None) -> DaemonTarget:
    """The daemon this TUI should show.

    Args:
        home: the ``--home`` directory, or None for the user daemon (falling
            back to the system service when only its socket exists).
    """
    if home or os.environ.get("P2PTRAIN_HOME"):
        paths = resolve_paths(home)
        return DaemonTarget(paths.socket, paths, f"p2ptrain daemon{paths.home_option()}", can_start=True)
    user = resolve_paths(None, system=False)
    system = resolve_paths(None, system=True)
    if not user.socket.exists() and system.socket.exists():
        return DaemonTarget(system.socket, system, "sudo systemctl start p2ptrain", can_start=False)
    return DaemonTarget(user.socket, user, "p2ptrain daemon", can_start=True)


def default_daemon_command() -> list[str]:
    """The ``p2ptrain`` executable next to this Python, or ``python -m p2ptrain.cli``."""
    beside_python = Path(sys.executable).with_name("p2ptrain")
    if beside_python.exists():
        return [str(beside_python)]
    on_path = shutil.which("p2ptrain")
    return [on_path] if on_path else [sys.executable, "-m", "p2ptrain.cli"]


def start_daemon(target: DaemonTarget, command: list[str] | None = None) -> subprocess.Popen:
    """Start ``p2ptrain daemon`` detached from the TUI, so quitting the TUI leaves it running.

    Its output goes to ``daemon-start.log`` in the installation's log directory.

    Args:
        target: the daemon to start (its ``--home`` is passed on).
        command: the ``p2ptrain`` executable as an argument list; defaults to
            :func:`default_daemon_command`.
    """
    argv = [*(command or default_daemon_command()), "daemon"]
    if target.paths.home is not None:
        argv += ["--home", str(target.paths.home)]
    target.paths.log_dir.mkdir(parents=True, exist_ok=True)
    with open(target.paths.log_dir / "daemon-start.log", "ab") as log:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
