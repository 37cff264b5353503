"""A real terminal for the TUI: one tmux pane on a private tmux server.

Used by the tmux test and by ``benchmarks/tui_first_frame.py``. Each
``TmuxPane`` starts its own tmux server on a socket in a temporary directory
(``tmux -S PATH -f /dev/null``), so it never touches a user's sessions or
configuration, and ``close`` ends that server, everything running in it, and
removes the directory.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

TMUX = shutil.which("tmux")


def tui_command(home: str | os.PathLike) -> list[str]:
    """``p2ptrain-tui --home HOME`` as a user runs it (the module when the script is not installed)."""
    script = shutil.which("p2ptrain-tui", path=os.path.dirname(sys.executable))
    return [script, "--home", str(home)] if script else [sys.executable, "-m", "p2ptrain.tui.app", "--home", str(home)]


class TmuxPane:
    """A detached tmux session of a fixed size running one command.

    The command inherits this process's environment (the tmux server does).

    Args:
        width, height: the terminal size in columns and rows.
    """

    def __init__(self, width: int = 120, height: int = 40) -> None:
        if TMUX is None:
            raise RuntimeError("tmux is not installed: apt-get install tmux")
        self.width, self.height = width, height
        self._directory: str | None = None

    def _tmux(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            [TMUX, "-S", os.path.join(self._directory, "socket"), "-f", "/dev/null", *args],
            capture_output=True, text=True, check=check, timeout=30,
        )

    def open(self) -> TmuxPane:
        """Start the tmux server with the pane holding an idle ``cat``.

        The command comes later (``run``), so the time it takes to start is not
        mixed with the time tmux takes to start its server.
        """
        # Under /tmp, not a long test directory: a socket's path must stay under ~100 bytes.
        self._directory = tempfile.mkdtemp(prefix="p2ptrain-tmux-", dir="/tmp")
        try:
            self._tmux("new-session", "-d", "-s", "main", "-x", str(self.width), "-y", str(self.height), "cat")
            # Keep the pane after its command ends, so that `exited` can tell.
            self._tmux("set-option", "-t", "main", "remain-on-exit", "on")
        except BaseException:
            self.close()
            raise
        return self

    def run(self, argv: list[str]) -> None:
        """Replace whatever runs in the pane with ``argv``."""
        self._tmux("respawn-pane", "-k", "-t", "main", f"exec {shlex.join(argv)}")

    def text(self) -> str:
        """What the terminal shows now, one line per row."""
        return self._tmux("capture-pane", "-p", "-t", "main").stdout

    def send(self, *keys: str) -> None:
        """Press keys, in tmux's names (``p``, ``Enter``, ``Escape``)."""
        self._tmux("send-keys", "-t", "main", *keys)

    @property
    def pid(self) -> int:
        """The process id of the command in the pane."""
        return int(self._tmux("display-message", "-p", "-t", "main", "#{pane_pid}").stdout)

    @property
    def exited(self) -> bool:
        """True once the command in the pane has ended."""
        result = self._tmux("display-message", "-p", "-t", "main", "#{pane_dead}", check=False)
        return result.stdout.strip() == "1"

    def wait_for(self, condition: Callable[[str], bool], timeout: float, interval: float = 0.02, what: str = "") -> str:
        """Poll the screen until ``condition(text)`` holds; return that text, or raise AssertionError."""
        deadline = time.monotonic() + timeout
        while True:
            screen = self.text()
            if condition(screen):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {what or 'the screen'}; it shows:\n{screen}")
            time.sleep(interval)

    def close(self) -> None:
        """End the tmux server and the command running in it."""
        if self._directory is not None:
            self._tmux("kill-server", check=False)
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None

    def __enter__(self) -> TmuxPane:
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()
