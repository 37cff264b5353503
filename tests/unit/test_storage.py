"""The SQLite storage: schema and migrations, batched writes, queries, retention.

Every test writes a real database file under tmp_path and checks it through a
second, independent sqlite3 connection, as another process would see it.
"""

import sqlite3
import subprocess
import sys
import time

import pytest

from p2ptrain.daemon.reports import WorkerReports
from p2ptrain.daemon.run_view import RunView
from p2ptrain.daemon.server import Broadcaster
from p2ptrain.storage import SCHEMA_VERSION, Database, SchemaTooNewError, StorageError
from p2ptrain.storage import queries
from p2ptrain.storage.retention import RetentionLimits
from p2ptrain.worker_pipe import PeerRow, Step


class ManualClock:
    """A monotonic clock the test moves by hand, so flush timing is exact."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def count_on_disk(path, table):
    with sqlite3.connect(path) as connection:
        return connection.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def pragma(path, name):
    with sqlite3.connect(path) as connection:
        return connection.execute(f"PRAGMA {name}").fetchone()[0]


def test_open_creates_directory_in_wal_mode_at_current_version(tmp_path):
    path = tmp_path / "state" / "deeper" / "p2ptrain.db"
    with Database.open(path) as db:
        assert db.connection.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
        assert db.connection.execute("PRAGMA busy_timeout").fetchone()[0] > 0
    assert path.exists()
    assert pragma(path, "journal_mode") == "wal"
    assert pragma(path, "user_version") == SCHEMA_VERSION


def make_v1_database(path):
    """The database as the first p2ptrain release wrote it."""
    with sqlite3.connect(path) as connection:
        connection.executescript(
            """
            CREATE TABLE events (ts FLOAT, kind TEXT, message TEXT, data TEXT);
            CREATE TABLE steps (ts FLOAT, run_id TEXT, epoch INTEGER, loss FLOAT,
                                samples INTEGER, samples_per_second FLOAT);
            CREATE TABLE epochs (run_id TEXT, epoch INTEGER, started_at FLOAT,
                                 ended_at FLOAT, duration_s FLOAT, num_peers INTEGER,
                                 global_samples INTEGER, loss FLOAT,
                                 PRIMARY KEY (run_id, epoch));
            CREATE TABLE peers (ts FLOAT, run_id TEXT, peer_id TEXT, nickname TEXT,
                                device TEXT, samples_per_second FLOAT, epoch INTEGER,
                                loss FLOAT);
            CREATE TABLE runs (run_id TEXT PRIMARY KEY, manifest TEXT,
                               joined_at FLOAT, left_at FLOAT);
            CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT);
            INSERT INTO epochs VALUES ('old-run', 3, 10.0, 70.0, 60.0, 2, 4096, 2.5);
            INSERT INTO peers VALUES (70.0, 'old-run', 'QmOld', 'alice', 'cuda:0', 12.5, 3, 2.5);
            INSERT INTO settings VALUES ('desired_state', '"paused"');
            PRAGMA user_version = 1;
            """
        )


def test_v1_database_is_migrated_forward_keeping_its_rows(tmp_path):
    path = tmp_path / "p2ptrain.db"
    make_v1_database(path)
    with Database.open(path) as db:
        assert db.get_setting("desired_state") == "paused"
        db.record_epoch("old-run", 4, 70.0, 130.0, 60.0, 3, 4096, 2.1, val_loss=2.3)
        db.record_peers("old-run", [PeerRow(peer_id="QmOld", precision="bf16", compatible=True)], ts=130.0)
        epochs = queries.recent_epochs(db, run_id="old-run")
        peers = queries.peers_table(db, "old-run")
    assert pragma(path, "user_version") == SCHEMA_VERSION
    assert [(e["epoch"], e["loss"], e["val_loss"]) for e in epochs] == [(3, 2.5, None), (4, 2.1, 2.3)]
    assert peers[0]["precision"] == "bf16" and peers[0]["nickname"] is None
    with sqlite3.connect(path) as connection:
        indexes = {row[1] for row in connection.execute("SELECT * FROM sqlite_master WHERE type = 'index'")}
    assert "idx_steps_ts" in indexes


def test_peer_rows_keep_what_each_peer_trained_and_what_the_run_used(tmp_path):
    path = tmp_path / "p2ptrain.db"
    make_v1_database(path)
    with Database.open(path) as db:
        db.record_peers("old-run", [PeerRow(peer_id="QmSlow", trained_samples=2048, contributed_samples=1928)], ts=130.0)
        peers = {peer["peer_id"]: peer for peer in queries.peers_table(db, "old-run")}
    assert (peers["QmSlow"]["trained_samples"], peers["QmSlow"]["contributed_samples"]) == (2048, 1928)
    assert peers["QmOld"]["trained_samples"] is None, "rows written before schema version 5 know nothing of it"


def make_v2_database(path):
    """The database as p2ptrain wrote it before steps had a worker column,
    with one step row in it."""
    make_v1_database(path)
    with sqlite3.connect(path) as connection:
        connection.executescript(
            """
            ALTER TABLE epochs ADD COLUMN val_loss FLOAT;
            ALTER TABLE peers ADD COLUMN precision TEXT;
            ALTER TABLE peers ADD COLUMN quantization TEXT;
            ALTER TABLE peers ADD COLUMN micro_batch INTEGER;
            ALTER TABLE peers ADD COLUMN reachability TEXT;
            ALTER TABLE peers ADD COLUMN compatible INTEGER;
            CREATE INDEX idx_steps_ts ON steps (ts);
            CREATE INDEX idx_steps_run_id_ts ON steps (run_id, ts);
            INSERT INTO steps VALUES (65.0, 'old-run', 3, 2.6, 32, 12.5);
            PRAGMA user_version = 2;
            """
        )


def test_steps_without_a_worker_column_are_migrated_and_stay_readable(tmp_path):
    path = tmp_path / "p2ptrain.db"
    make_v2_database(path)
    with Database.open(path, flush_interval_s=3600, clock=ManualClock()) as db:
        db.record_step("old-run", 4, 2.4, 32, 12.0, ts=75.0, worker="gpu1")
        db.flush()
        steps = queries.steps_since(db, run_id="old-run")
    assert pragma(path, "user_version") == SCHEMA_VERSION
    assert [(s["ts"], s["loss"], s["worker"]) for s in steps] == [(65.0, 2.6, None), (75.0, 2.4, "gpu1")]
    assert [s["worker"] for s in queries.steps_since(path)] == [None, "gpu1"]


def test_step_reports_of_two_workers_are_stored_with_their_names(tmp_path):
    def step(ts, loss):
        return Step(ts=ts, epoch=3, loss=loss, samples=32, samples_per_second=8.0)

    path = tmp_path / "p2ptrain.db"
    with Database.open(path, flush_interval_s=3600, clock=ManualClock()) as db:
        run = RunView(run_id="run")
        run.worker("gpu0", "cuda:0")
        run.worker("gpu1", "cuda:1")
        # the daemon's report handlers over a real database; steps need no events, state machine or pool
        reports = WorkerReports(run, db, Broadcaster(dict), events=None, control=None, pool=None)
        reports.on_report("gpu0", step(10.0, 3.0))
        reports.on_report("gpu1", step(10.5, 3.5))
        reports.on_report("gpu0", step(11.0, 2.9))
        reports.on_report("gpu1", step(11.5, 3.4))
    with sqlite3.connect(path) as connection:
        rows = connection.execute("SELECT worker, loss FROM steps ORDER BY ts").fetchall()
    assert rows == [("gpu0", 3.0), ("gpu1", 3.5), ("gpu0", 2.9), ("gpu1", 3.4)]


def test_newer_schema_is_refused_with_a_one_line_fix(tmp_path):
    path = tmp_path / "p2ptrain.db"
    Database.open(path).close()
    with sqlite3.connect(path) as connection:
        connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(SchemaTooNewError) as raised:
        Database.open(path)
    message = raised.value.one_line()
    assert f"schema version {SCHEMA_VERSION + 1}" in message
    assert "upgrade p2ptrain" in message and "\n" not in message
    assert pragma(path, "user_version") == SCHEMA_VERSION + 1


def test_file_that_is_not_a_database_is_refused_with_a_fix(tmp_path):
    path = tmp_path / "p2ptrain.db"
    path.write_bytes(b"this is a text file, not SQLite " * 100)
    with pytest.raises(StorageError, match="move it aside"):
        Database.open(path)


def test_rows_wait_until_the_flush_interval_has_passed(tmp_path):
    path = tmp_path / "p2ptrain.db"
    clock = ManualClock()
    with Database.open(path, flush_interval_s=2.0, max_batch=500, clock=clock) as db:
        db.record_step("run", 0, 3.0, 32, 10.0)
        clock.now += 1.9
        db.record_step("run", 0, 2.9, 32, 10.0)
        assert db.maybe_flush() is False
        assert count_on_disk(path, "steps") == 0
        clock.now += 0.1
        assert db.maybe_flush() is True
        assert count_on_disk(path, "steps") == 2
        assert db.buffered_rows == 0


def test_a_full_batch_is_written_without_waiting(tmp_path):
    path = tmp_path / "p2ptrain.db"
    with Database.open(path, flush_interval_s=3600, max_batch=10, clock=ManualClock()) as db:
        for i in range(9):
            db.record_event("step", f"event {i}")
        assert count_on_disk(path, "events") == 0
        db.record_event("step", "event 9")
        assert count_on_disk(path, "events") == 10


def test_queries_return_what_was_written(tmp_path):
    path = tmp_path / "p2ptrain.db"
    manifest = {"run_id": "run-b", "mode": "diloco", "target_batch_size": 4096}
    with Database.open(path, flush_interval_s=3600, clock=ManualClock()) as db:
        db.record_run_joined("run-a", {"run_id": "run-a"}, ts=50.0)
        db.record_run_left("run-a", ts=60.0)
        db.record_run_joined("run-b", manifest, ts=100.0)
        for epoch in range(5):
            db.record_epoch("run-b", epoch, 100.0 + 10 * epoch, 110.0 + 10 * epoch, 10.0, 2, 4096, 5.0 - epoch)
        db.record_epoch("run-a", 9, 50.0, 55.0, 5.0, 1, 4096, 9.0)
        for i in range(6):
            db.record_step("run-b", 0, 4.0 - i / 10, 32, 16.0, ts=200.0 + i)
        db.record_step("run-a", 9, 9.0, 32, 16.0, ts=55.0)
        db.record_event("state", "training", {"state": "training"}, ts=101.0)
        db.record_event("pause", "paused by user", None, ts=102.0)
        db.record_peers("run-b", [PeerRow(peer_id="QmA", loss=3.0), PeerRow(peer_id="QmB", loss=3.1)], ts=150.0)
        db.record_peers("run-b", [PeerRow(peer_id="QmA", loss=2.0, compatible=False)], ts=160.0)
        db.flush()

        epochs = queries.recent_epochs(db, run_id="run-b", limit=3)
        assert [e["epoch"] for e in epochs] == [2, 3, 4]
        assert [e["run_id"] for e in queries.recent_epochs(db)] == ["run-a"] + ["run-b"] * 5
        steps = queries.steps_since(db, since=202.0, run_id="run-b")
        assert [s["ts"] for s in steps] == [203.0, 204.0, 205.0]
        assert [s["ts"] for s in queries.steps_since(db, limit=2)] == [204.0, 205.0]
        events = queries.events_since(db, since=100.0)
        assert [(e["kind"], e["data"]) for e in events] == [("state", {"state": "training"}), ("pause", None)]
        peers = queries.peers_table(db, "run-b")
        assert [(p["peer_id"], p["loss"], p["last_seen"], p["compatible"]) for p in peers] == [
            ("QmA", 2.0, 160.0, False),
            ("QmB", 3.1, 150.0, None),
        ]
        assert [p["peer_id"] for p in queries.peers_table(db, "run-b", max_age_s=5)] == ["QmA"]
    # The same answers from the file alone, as a tool without the daemon sees it.
    assert [e["epoch"] for e in queries.recent_epochs(path, run_id="run-b", limit=3)] == [2, 3, 4]


def test_queries_see_rows_still_in_the_buffer(tmp_path):
    path = tmp_path / "p2ptrain.db"
    with Database.open(path, flush_interval_s=3600, clock=ManualClock()) as db:
        db.record_step("run", 0, 3.0, 32, 10.0, ts=10.0)
        db.record_run_joined("run", {"run_id": "run"}, ts=5.0)
        db.record_epoch("run", 0, 1.0, 9.0, 8.0, 1, 64, 3.5)
        db.record_event("state", "training", ts=11.0)
        assert count_on_disk(path, "steps") == 0
        assert [s["loss"] for s in queries.steps_since(db)] == [3.0]
        assert [e["epoch"] for e in queries.recent_epochs(db)] == [0]
        assert [e["kind"] for e in queries.events_since(db)] == ["state"]
        # reading never makes the writer write: the rows wait for their flush interval
        assert db.buffered_rows == 4
        assert count_on_disk(path, "steps") == 0 and count_on_disk(path, "events") == 0


def test_joining_and_leaving_a_run_are_recorded(tmp_path):
    path = tmp_path / "p2ptrain.db"
    with Database.open(path) as db:
        db.record_run_joined("run", {"run_id": "run"}, ts=5.0)
        db.record_run_left("run", ts=6.0)
    with sqlite3.connect(path) as connection:
        assert connection.execute("SELECT run_id, joined_at, left_at FROM runs").fetchall() == [("run", 5.0, 6.0)]


def test_query_of_a_missing_file_says_how_to_create_it(tmp_path):
    with pytest.raises(StorageError, match="start the daemon once"):
        queries.events_since(tmp_path / "nothing.db")


def test_query_limit_must_be_positive(tmp_path):
    with Database.open(tmp_path / "p2ptrain.db") as db, pytest.raises(ValueError, match="positive integer"):
        queries.steps_since(db, limit=0)


def test_retention_deletes_old_steps_peers_and_surplus_events(tmp_path):
    path = tmp_path / "p2ptrain.db"
    now = time.time()
    day = 86400
    with Database.open(path) as db:
        db.record_step("run", 0, 3.0, 32, 10.0, ts=now - 40 * day)
        db.record_step("run", 1, 2.0, 32, 10.0, ts=now - 3600)
        db.record_peers("run", [PeerRow(peer_id="QmOld")], ts=now - 8 * day)
        db.record_peers("run", [PeerRow(peer_id="QmNew")], ts=now - 1 * day)
        for i in range(10):
            db.record_event("tick", f"event {i}", ts=now - 100 + i)
        db.record_epoch("run", 0, now - 50 * day, now - 49 * day, day, 1, 4096, 3.0)
        counts = db.apply_retention(RetentionLimits(keep_steps_days=30, keep_events=3, keep_peers_days=7), now=now)
        assert {table: counts[table] for table in ("steps", "events", "peers")} == {"steps": 1, "events": 7, "peers": 1}
        assert [s["epoch"] for s in queries.steps_since(db)] == [1]
        assert [e["message"] for e in queries.events_since(db)] == ["event 7", "event 8", "event 9"]
        assert [p["peer_id"] for p in queries.peers_table(db, "run")] == ["QmNew"]
        assert len(queries.recent_epochs(db)) == 1
    with sqlite3.connect(path) as connection:
        assert connection.execute("PRAGMA integrity_check").fetchall() == [("ok",)]


def test_settings_are_on_disk_at_once_and_survive_reopen(tmp_path):
    path = tmp_path / "p2ptrain.db"
    db = Database.open(path, flush_interval_s=3600)
    assert db.get_setting("desired_state", default="idle") == "idle"
    assert db.set_setting("desired_state", {"state": "paused", "until": 123.0}) is True
    with sqlite3.connect(path) as connection:
        assert connection.execute("SELECT count(*) FROM settings").fetchone()[0] == 1
    db.close()
    with Database.open(path) as reopened:
        assert reopened.get_setting("desired_state") == {"state": "paused", "until": 123.0}


def test_peer_rows_need_a_peer_id(tmp_path):
    with Database.open(tmp_path / "p2ptrain.db") as db:
        with pytest.raises(ValueError, match="peer_id"):
            db.record_peers("run", [PeerRow(peer_id="QmA"), PeerRow(peer_id="", nickname="no id")])
        assert db.buffered_rows == 0


def test_importing_storage_loads_neither_torch_nor_hivemind():
    code = (
        "import sys, p2ptrain.storage, p2ptrain.storage.queries\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'hivemind'))\n"
        "print(heavy)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_non_finite_losses_are_stored_as_missing(tmp_path):
    with Database.open(tmp_path / "p2ptrain.db", flush_interval_s=3600, clock=ManualClock()) as db:
        db.record_step("run", 0, float("nan"), 32, float("inf"), ts=1.0)
        db.record_epoch("run", 0, 0.0, 1.0, 1.0, 1, 32, float("inf"), val_loss=float("nan"))
        buffered = db.pending_rows("steps")
        stored = queries.steps_since(db)
        epoch = queries.recent_epochs(db)[0]
    assert buffered == stored
    assert (stored[0]["loss"], stored[0]["samples_per_second"]) == (None, None)
    assert (epoch["loss"], epoch["val_loss"]) == (None, None)
