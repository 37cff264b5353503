"""The storage under stress: a writer killed mid-batch, a read-only file, a full disk.

Nothing here is simulated above SQLite: the writer is a real child process
killed with SIGKILL, the read-only file is really read-only (for root, which
ignores file modes, the file is also made immutable with chattr), and the full
disk is SQLite's own SQLITE_FULL from a page-count limit.
"""

import contextlib
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap

import pytest
import sqlite_utils

from p2ptrain.storage import Database, StorageError
from p2ptrain.storage import queries, schema

STEPS_PER_BATCH = 200

WRITER = textwrap.dedent(
    f"""
    import sys
    from p2ptrain.storage import Database

    db = Database.open(sys.argv[1], flush_interval_s=3600, max_batch=10**9)
    batch = 0
    while True:
        for i in range({STEPS_PER_BATCH}):
            db.record_step("run", batch, 1.0, i, 1.0)
        db.record_event("batch", str(batch))
        if not db.flush():
            sys.exit(db.last_write_error)
        print(batch, flush=True)
        batch += 1
    """
)


@pytest.mark.timeout(60)
def test_killed_writer_leaves_a_sound_database_with_every_flushed_batch(tmp_path):
    path = tmp_path / "p2ptrain.db"
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        reported = []
        for line in writer.stdout:
            reported.append(int(line))
            if len(reported) >= 20:
                break
        assert len(reported) >= 20, "the writer stopped before writing 20 batches"
        os.kill(writer.pid, signal.SIGKILL)
        rest, _ = writer.communicate(timeout=30)
        reported += [int(line) for line in rest.split()]
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait(timeout=30)
    assert writer.returncode == -signal.SIGKILL

    with sqlite3.connect(path) as connection:
        assert connection.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        per_batch = dict(connection.execute("SELECT epoch, count(*) FROM steps GROUP BY epoch"))
        events = connection.execute("SELECT count(*) FROM events").fetchone()[0]
    # Every batch reported as flushed is there; none is there in part.
    assert set(reported) <= set(per_batch)
    assert set(per_batch.values()) == {STEPS_PER_BATCH}
    assert events == len(per_batch)
    with Database.open(path), sqlite3.connect(path) as connection:  # opened again by the daemon: still sound
        assert connection.execute("PRAGMA integrity_check").fetchall() == [("ok",)]


@contextlib.contextmanager
def read_only(path):
    """Make a file read-only for this process, then writable again on exit."""
    mode = path.stat().st_mode
    path.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    immutable = False
    try:
        if os.geteuid() == 0:
            result = subprocess.run(["chattr", "+i", str(path)], capture_output=True)
            if result.returncode != 0:
                pytest.skip(f"running as root and chattr +i failed: {result.stderr.decode().strip()}")
            immutable = True
        yield
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        path.chmod(mode)


def test_read_only_file_keeps_rows_buffered_until_writable_again(tmp_path):
    path = tmp_path / "p2ptrain.db"
    with Database.open(path) as db:
        db.set_setting("desired_state", "training")

    with read_only(path):
        db = Database.open(path, flush_interval_s=0.0)
        assert db.get_setting("desired_state") == "training"
        db.record_step("run", 0, 3.0, 32, 10.0, ts=10.0)
        db.record_epoch("run", 0, 0.0, 10.0, 10.0, 1, 32, 3.0)
        assert db.set_setting("desired_state", "paused") is False
        assert db.flush() is False
        assert "readonly" in db.last_write_error and "writable" in db.last_write_error
        assert db.buffered_rows == 3
        assert db.get_setting("desired_state") == "paused"
        assert [s["loss"] for s in queries.steps_since(db)] == [3.0]
        assert [e["epoch"] for e in queries.recent_epochs(db)] == [0]

    assert db.flush() is True
    assert db.last_write_error is None and db.buffered_rows == 0
    db.close()
    assert [s["loss"] for s in queries.steps_since(path)] == [3.0]
    with Database.open(path) as reopened:
        assert reopened.get_setting("desired_state") == "paused"


def test_full_disk_drops_oldest_steps_first_and_recovers(tmp_path):
    path = tmp_path / "p2ptrain.db"
    db = Database.open(path, flush_interval_s=0.0, max_buffered_rows=50)
    try:
        pages = db.connection.execute("PRAGMA page_count").fetchone()[0]
        db.connection.execute(f"PRAGMA max_page_count = {pages}")
        # Larger than a page: it needs new pages, which the limit refuses.
        db.record_event("state", "training", {"log": "x" * 100_000})
        db.record_epoch("run", 0, 0.0, 10.0, 10.0, 1, 32, 3.0)
        for i in range(60):
            db.record_step("run", 0, float(i), 32, 10.0, ts=100.0 + i)
        assert "full" in db.last_write_error
        assert db.buffered_rows == 50
        assert db.dropped_rows == 12

        db.connection.execute("PRAGMA max_page_count = 1000000")
        assert db.flush() is True
        assert db.last_write_error is None
        steps = queries.steps_since(path)
        assert [s["loss"] for s in steps] == [float(i) for i in range(12, 60)]
        assert len(queries.recent_epochs(path)) == 1 and len(queries.events_since(path)) == 1
    finally:
        db.close()


def test_read_only_file_that_needs_a_migration_is_refused_and_left_intact(tmp_path):
    path = tmp_path / "p2ptrain.db"
    old = sqlite_utils.Database(path)
    schema.MIGRATIONS[0](old)
    old.execute("PRAGMA user_version = 1")
    old.close()
    with read_only(path):
        with pytest.raises(StorageError, match="writable") as raised:
            Database.open(path)
    assert "\n" not in raised.value.one_line()
    with sqlite3.connect(path) as connection:
        assert connection.execute("PRAGMA user_version").fetchone()[0] == 1
        columns = [row[1] for row in connection.execute("PRAGMA table_info(epochs)")]
    assert "val_loss" not in columns
