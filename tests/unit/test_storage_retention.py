"""Retention: old steps folded per minute then deleted, events capped, and a file that really shrinks.

Real database files, written through the daemon's own writer (``Database``),
checked through independent sqlite3 connections.
"""

import sqlite3
import time

import pytest
import sqlite_utils

from p2ptrain.storage import SCHEMA_VERSION, Database
from p2ptrain.storage.schema import MIGRATIONS
from p2ptrain.worker_pipe import PeerRow
from p2ptrain.storage import queries
from p2ptrain.storage.retention import DAY_S, RetentionLimits, RetentionThread

NOW = 1_800_000_000.0  # a Unix time on a minute boundary (divisible by 60)


def rows(path, sql, params=()):
    with sqlite3.connect(path) as connection:
        return connection.execute(sql, params).fetchall()


def test_steps_older_than_a_day_become_one_row_per_minute_per_worker_and_run(tmp_path):
    path = tmp_path / "p2ptrain.db"
    old_minute = NOW - 2 * DAY_S  # a minute two days ago
    with Database.open(path, flush_interval_s=3600) as db:
        for second in range(60):  # one report a second from two workers of one run
            db.record_step("run", 4, 3.0 if second % 2 else 1.0, 8, 16.0, ts=old_minute + second, worker="gpu0")
            db.record_step("run", 5, 2.0, 4, 8.0, ts=old_minute + second, worker="gpu1")
        db.record_step("run", 5, None, 4, 8.0, ts=old_minute + 60, worker="gpu1")  # the next minute, loss unknown
        db.record_step("other", 1, 5.0, 2, 1.0, ts=old_minute + 30, worker="gpu0")
        for second in range(5):  # the last hour stays as reported
            db.record_step("run", 9, 1.5, 8, 16.0, ts=NOW - 3600 + second, worker="gpu0")
        counts = db.apply_retention(RetentionLimits(keep_steps_days=30), now=NOW)

    assert counts["folded"] == 122
    folded = rows(
        path,
        "SELECT ts, run_id, worker, epoch, samples, loss, samples_per_second, reports FROM steps "
        "WHERE reports IS NOT NULL ORDER BY ts, run_id, worker",
    )
    assert folded == [
        (old_minute, "other", "gpu0", 1, 2, 5.0, 1.0, 1),
        (old_minute, "run", "gpu0", 4, 8 * 60, 2.0, 16.0, 60),
        (old_minute, "run", "gpu1", 5, 4 * 60, 2.0, 8.0, 60),
        (old_minute + 60, "run", "gpu1", 5, 4, None, 8.0, 1),
    ]
    assert rows(path, "SELECT count(*) FROM steps WHERE reports IS NULL") == [(5,)]


def test_folding_again_keeps_the_sums_and_weights_a_late_report(tmp_path):
    path = tmp_path / "p2ptrain.db"
    minute = NOW - 3 * DAY_S
    limits = RetentionLimits(keep_steps_days=30)
    with Database.open(path, flush_interval_s=3600) as db:
        for second in range(3):
            db.record_step("run", 1, 1.0, 10, 5.0, ts=minute + second)
        db.apply_retention(limits, now=NOW)
        assert db.apply_retention(limits, now=NOW + 3600)["folded"] == 0  # nothing new: nothing changes
        db.record_step("run", 1, 5.0, 10, 9.0, ts=minute + 59)  # a report that arrived late
        db.apply_retention(limits, now=NOW + 7200)
    assert rows(path, "SELECT ts, samples, loss, samples_per_second, reports FROM steps") == [(minute, 40, 2.0, 6.0, 4)]


def test_steps_older_than_keep_steps_days_and_surplus_events_are_deleted(tmp_path):
    path = tmp_path / "p2ptrain.db"
    with Database.open(path, flush_interval_s=3600) as db:
        for age_s in (3 * DAY_S, 1.5 * DAY_S, 600, 10):
            db.record_step("run", 0, 1.0, 1, 1.0, ts=NOW - age_s)
        for index in range(50):
            db.record_event("tick", f"event {index}", ts=NOW - 50 + index)
        counts = db.apply_retention(RetentionLimits(keep_steps_days=2, keep_events=20), now=NOW)
        assert (counts["steps"], counts["events"]) == (1, 30)
        ages = [NOW - row["ts"] for row in queries.steps_since(db)]
        assert ages == [1.5 * DAY_S, 600, 10]  # the 1.5-day-old step, folded to its minute (already on one)
        assert [event["message"] for event in queries.events_since(db, limit=100)][0] == "event 30"


def test_the_file_shrinks_once_old_rows_are_gone(tmp_path):
    path = tmp_path / "p2ptrain.db"
    with Database.open(path, flush_interval_s=3600, max_batch=100_000) as db:
        for index in range(200_000):
            db.record_step("run", 0, 1.0, 8, 16.0, ts=NOW - 5 * DAY_S + index)
        db.flush()
        rows(path, "PRAGMA wal_checkpoint(TRUNCATE)")
        full_size = path.stat().st_size
        counts = db.apply_retention(RetentionLimits(keep_steps_days=1), now=NOW)
    assert counts["steps"] == 200_000 and counts["pages_freed"] > 0
    assert path.stat().st_size < full_size / 10, (full_size, path.stat().st_size)
    wal = path.with_name(path.name + "-wal")
    assert not wal.exists() or wal.stat().st_size == 0


def test_a_version_3_database_is_switched_to_incremental_vacuum_when_opened(tmp_path):
    path = tmp_path / "p2ptrain.db"
    old = sqlite_utils.Database(path)  # as p2ptrain wrote it before version 4: no auto_vacuum
    for migration in MIGRATIONS[:3]:
        migration(old)
    old.execute("PRAGMA user_version = 3")
    old["steps"].insert({"ts": NOW, "run_id": "run", "epoch": 2, "loss": 1.0, "samples": 8, "samples_per_second": 4.0})
    old.close()
    assert rows(path, "PRAGMA auto_vacuum") == [(0,)]
    with Database.open(path) as db:
        assert [step["epoch"] for step in queries.steps_since(db)] == [2]
    assert rows(path, "PRAGMA auto_vacuum") == [(2,)]
    assert rows(path, "PRAGMA user_version") == [(SCHEMA_VERSION,)]


def test_limits_set_how_often_retention_runs():
    assert RetentionLimits(keep_steps_days=30).interval_s() == 3600
    assert RetentionLimits(keep_steps_days=0.0005).interval_s() == pytest.approx(0.0005 * DAY_S / 4)
    with pytest.raises(ValueError, match=">= 0"):
        RetentionLimits(keep_events=-1)


@pytest.mark.timeout(60)
def test_the_retention_thread_runs_at_once_while_the_writer_keeps_writing(tmp_path, caplog):
    path = tmp_path / "p2ptrain.db"
    now = time.time() // 60 * 60
    with Database.open(path, flush_interval_s=0) as db:
        for second in range(3 * 3600):
            db.record_step("run", 0, 1.0, 8, 16.0, ts=now - 2 * DAY_S + second)
        db.flush()
        thread = RetentionThread(path, lambda: RetentionLimits(keep_steps_days=30))
        thread.start()
        try:
            deadline = time.monotonic() + 30
            while thread.last_result is None and time.monotonic() < deadline:
                db.record_step("run", 1, 1.0, 8, 16.0)  # the daemon's writer goes on meanwhile
                time.sleep(0.01)
        finally:
            thread.stop()
        assert thread.last_error is None and thread.last_result["folded"] == 3 * 3600
        assert db.flush()
    # the writer waited for the lock instead of failing ("database is locked")
    assert not [record for record in caplog.records if "cannot write" in record.getMessage()]
    assert rows(path, "SELECT count(*) FROM steps WHERE reports = 60") == [(3 * 60,)]
    assert rows(path, "SELECT count(*) FROM steps WHERE epoch = 1")[0][0] > 0


@pytest.mark.timeout(30)
def test_a_limit_that_is_no_number_is_reported_and_the_retention_thread_stays(tmp_path):
    with Database.open(tmp_path / "p2ptrain.db", flush_interval_s=0):
        pass
    thread = RetentionThread(tmp_path / "p2ptrain.db", lambda: RetentionLimits(keep_steps_days="30"))
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while thread.last_error is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert thread.last_error is not None and "str" in thread.last_error
        assert thread._thread.is_alive(), "a bad limit ended the retention thread: nothing would be deleted until a restart"
    finally:
        thread.stop()
    assert not thread._thread.is_alive()


def test_peer_snapshots_older_than_an_hour_keep_the_last_of_each_peer_per_10_minutes(tmp_path):
    path = tmp_path / "p2ptrain.db"
    with Database.open(path, flush_interval_s=3600) as db:
        for second in range(0, 1200, 5):  # two peers every 5 s for 20 minutes, two hours ago
            db.record_peers("run", [PeerRow(peer_id="QmA", loss=second), PeerRow(peer_id="QmB")], ts=NOW - 7200 + second)
        for second in range(0, 60, 5):  # and in the last minute
            db.record_peers("run", [PeerRow(peer_id="QmA", loss=-1.0)], ts=NOW - 60 + second)
        counts = db.apply_retention(RetentionLimits(), now=NOW)
    assert counts["peers"] == 2 * 240 - 4
    old = rows(path, "SELECT ts, loss FROM peers WHERE peer_id = 'QmA' AND ts < ? ORDER BY ts", [NOW - 3600])
    assert old == [(NOW - 7200 + 595, 595.0), (NOW - 7200 + 1195, 1195.0)]
    assert rows(path, "SELECT count(*) FROM peers WHERE ts >= ?", [NOW - 60]) == [(12,)]


def test_epochs_older_than_two_days_keep_the_last_of_each_run_per_hour(tmp_path):
    path = tmp_path / "p2ptrain.db"
    every_s = 20  # a sync epoch every 20 s, in the 8-40 s of the project's runs
    with Database.open(path, flush_interval_s=3600) as db:
        for epoch in range(3 * 4320):  # three days of one run, ending now
            ended = NOW - 3 * DAY_S + (epoch + 1) * every_s
            db.record_epoch("run", epoch, ended - every_s, ended, every_s, 4, 256, 3.0 - epoch / 10_000, None)
        db.record_epoch("other", 0, NOW - 4 * DAY_S - 10, NOW - 4 * DAY_S, 10.0, 2, 64, 2.0, None)  # alone in its hour
        counts = db.apply_retention(RetentionLimits(), now=NOW)
    recent = rows(path, "SELECT count(*) FROM epochs WHERE run_id = 'run' AND ended_at > ?", [NOW - 2 * DAY_S])
    assert recent == [(2 * 4320,)]  # the last two days as written
    old = rows(path, "SELECT epoch, ended_at FROM epochs WHERE run_id = 'run' AND ended_at < ? ORDER BY epoch", [NOW - 2 * DAY_S])
    assert len(old) == 24  # the day before: the last epoch of each hour
    assert all(ended % 3600 == 3600 - every_s for _, ended in old) and old[-1][0] == 4320 - 2
    assert counts["epochs"] == 4320 - 1 - 24
    assert rows(path, "SELECT epoch FROM epochs WHERE run_id = 'other'") == [(0,)]
    # a second pass keeps what the first kept
    with Database.open(path) as db:
        assert db.apply_retention(RetentionLimits(), now=NOW)["epochs"] == 0
