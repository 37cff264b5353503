"""The disk holding the database fills up while the daemon trains.

A real filesystem limit, not a SQLite pragma: the daemon's state directory (the
database, its WAL, the checkpoints) is a small tmpfs, and a file written until
ENOSPC takes the rest of it, as a download or a log gone wild would. Mounting
needs root (CI runs as root); without it the test is skipped.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from daemons import cli
from p2ptrain.paths import resolve_paths

pytestmark = [pytest.mark.swarm]

STATE_DISK_SIZE = "64m"  # room for the database and a checkpoint of the tiny model
SYNC_RUN = ["--mode", "sync", "--target-batch-size", "96", "--micro-batch", "8"]


def mount_small_disk(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem for the database needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={STATE_DISK_SIZE}", "tmpfs", str(directory)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (a container without CAP_SYS_ADMIN?): {mounted.stderr.strip()}")


def fill(directory: Path) -> Path:
    """Write a file in ``directory`` until its filesystem has no room left.

    Unbuffered: a buffered file would try to flush the rejected bytes again
    when it closes, and raise ENOSPC there.
    """
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as output:
        chunk = b"\0" * (1 << 16)
        try:
            while True:
                output.write(chunk)
        except OSError as error:
            assert error.errno == 28, error  # ENOSPC
    return filler


def disk_lines(status: dict) -> list[str]:
    return [f"{line['message']} {line.get('fix', '')}" for line in status["health"] if "database" in line["message"]]


def epoch_of(status: dict) -> int:
    return (status.get("run") or {}).get("epoch") or 0


@pytest.mark.timeout(600)
def test_a_full_disk_does_not_stop_training_health_says_so_and_rows_are_written_later(daemons, short_tmp):
    state_dir = resolve_paths(short_tmp / "full").state_dir
    mount_small_disk(state_dir)
    filler = None
    try:
        daemon = daemons.start("full")
        created = cli(daemon.home, "join", "--new-run", "disk-full", *SYNC_RUN)
        assert created.returncode == 0, created.stderr
        start = daemon.wait_until(lambda s: s["state"] == "training" and epoch_of(s) >= 1, 300, what="training at epoch 1")
        epoch = epoch_of(start)

        filler = fill(state_dir)
        full_since = time.time()
        full = daemon.wait_until(lambda s: disk_lines(s), 60, what="a health line about the database")
        [line] = disk_lines(full)
        assert "full" in line and str(state_dir) in line and "free space" in line, line
        assert full["state"] == "training"
        reached = daemon.wait_until(lambda s: s["state"] == "training" and epoch_of(s) >= epoch + 2, 240,
                                    what="two more epochs on a full disk")
        assert disk_lines(reached), "the disk is still full: the health line must stay"
        # `p2ptrain status` shows it to the user too
        shown = cli(daemon.home, "status")
        assert shown.returncode == 0 and "full" in shown.stdout, shown.stdout + shown.stderr
        full_until = time.time()

        filler.unlink()
        filler = None
        daemon.wait_until(lambda s: not disk_lines(s), 30, what="the health line to clear once there is room")
        database = resolve_paths(daemon.home).database
        with sqlite3.connect(database) as connection:
            stored_epochs = {row[0] for row in connection.execute("SELECT epoch FROM epochs WHERE run_id = 'disk-full'")}
            steps_while_full = connection.execute("SELECT COUNT(*) FROM steps WHERE ts BETWEEN ? AND ?", [full_since, full_until]).fetchone()[0]
            integrity = connection.execute("PRAGMA integrity_check").fetchone()[0]
        assert set(range(epoch, epoch + 2)) <= stored_epochs, f"epochs finished on the full disk are written later: {sorted(stored_epochs)}"
        assert steps_while_full > 0, "step rows recorded on the full disk are written later"
        assert integrity == "ok"
        status = json.loads(cli(daemon.home, "status", "--json").stdout)
        assert status["state"] == "training"
    finally:
        if filler is not None:
            filler.unlink()
        for daemon in daemons.all:
            daemon.terminate(timeout=30)
            daemon.kill()
        subprocess.run(["umount", "--lazy", str(state_dir)], capture_output=True)
