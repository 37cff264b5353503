"""Fake system commands for tests: the boundary where this machine lacks what a volunteer's has."""

from __future__ import annotations

import os
from pathlib import Path


def fake_loginctl(directory: Path, delay_s: float, idle: bool = False) -> dict:
    """Write a ``loginctl`` that answers after ``delay_s`` seconds for one local
    session in use (or idle), and return the environment (PATH) that finds it first.

    Args:
        directory: where to put the script.
        delay_s: how long each call takes (the real one waits on D-Bus).
        idle: report the session idle since boot instead of in use.
    """
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "loginctl"
    script.write_text(
        "#!/bin/sh\n"
        f"sleep {delay_s}\n"
        'case "$1" in\n'
        '  list-sessions) echo "c1 0 volunteer seat0 tty1" ;;\n'
        f'  show-session) printf "IdleHint={"yes" if idle else "no"}\\nIdleSinceHintMonotonic=1\\nRemote=no\\nClass=user\\n" ;;\n'
        "esac\n"
    )
    script.chmod(0o755)
    return {"PATH": f"{directory}{os.pathsep}{os.environ.get('PATH', '')}"}
