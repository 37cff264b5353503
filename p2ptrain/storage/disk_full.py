"""The one-line message for a database write that failed because the disk is full."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def disk_full_message(path: Path, waiting_rows: int) -> str:
    """One line for SQLITE_FULL that names the disk (its mount point and free
    space) and the fix.

    Args:
        path: the database file.
        waiting_rows: rows kept in memory until there is room.
    """
    mount = _mount_point(path)
    try:
        free = f"{shutil.disk_usage(mount).free / 2**20:.1f} MiB free"
    except OSError:
        free = "free space unknown"
    return (
        f"the disk holding {path} is full ({mount}: {free}): free space on {mount}; "
        f"{waiting_rows} rows wait in memory and are written once there is room"
    )


def _mount_point(path: Path) -> str:
    current = os.path.realpath(path.parent)
    while not os.path.ismount(current):
        current = os.path.dirname(current)
    return current
