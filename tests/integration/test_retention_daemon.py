"""A real daemon applies retention when it starts and then periodically, off its event loop."""

from __future__ import annotations

import sqlite3
import time

import pytest

from daemons import cli
from p2ptrain.paths import resolve_paths
from p2ptrain.storage import Database


@pytest.mark.timeout(120)
def test_no_step_row_older_than_60_s_remains_30_s_after_a_restart(daemons):
    daemon = daemons.start("keep")
    assert cli(daemon.home, "config", "set", "storage.keep_steps_days", "0.0005").returncode == 0  # 43.2 s
    assert daemon.terminate() == 0
    database = resolve_paths(daemon.home).database
    now = time.time()
    with Database.open(database) as db:  # what an hour of training left, one report a second
        for age_s in range(3600, 0, -1):
            db.record_step("run", 0, 2.0, 8, 16.0, ts=now - age_s, worker="cpu")

    restarted = daemons.start("keep")
    started = time.time()
    time.sleep(max(0.0, started + 30 - time.time()))
    restarted.status()  # still answering
    with sqlite3.connect(database) as connection:
        oldest = connection.execute("SELECT MIN(ts), COUNT(*) FROM steps").fetchone()
    assert oldest[1] == 0 or time.time() - oldest[0] <= 60, f"{oldest[1]} rows, the oldest {time.time() - oldest[0]:.0f} s old"
    assert oldest[1] < 60  # at most the reports of the last minute were kept
