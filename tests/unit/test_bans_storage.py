"""The ``bans`` table (``storage/bans.py``): stored at once, per run, lifted one by one or all."""

from __future__ import annotations

import sqlite3

from p2ptrain.storage.bans import banned_peers, lift_bans, record_ban
from p2ptrain.storage.database import Database


def test_a_ban_is_on_disk_at_once_per_run_and_lifted_one_by_one_or_all(tmp_path):
    path = tmp_path / "p2ptrain.db"
    with Database.open(path) as db:
        assert record_ban(db, "run-a", "QmRogue", "implausible-update", 3, ts=10.0)
        assert record_ban(db, "run-a", "QmOther", "outlier", 4, ts=20.0)
        assert record_ban(db, "run-b", "QmRogue", "replayed", 3, ts=30.0)
        # no flush: another connection (a daemon restarted after a crash) sees it
        with sqlite3.connect(path) as reader:
            assert reader.execute("SELECT count(*) FROM bans").fetchone()[0] == 3
        assert [ban["peer_id"] for ban in banned_peers(db, "run-a")] == ["QmRogue", "QmOther"]
        assert banned_peers(db, "run-a")[0] == {"peer_id": "QmRogue", "banned_at": 10.0, "reason": "implausible-update", "rounds_named": 3}
        assert banned_peers(db, None) == []

        assert lift_bans(db, "run-a", ["QmRogue", "QmNobody"]) == ["QmRogue"]
        assert [ban["peer_id"] for ban in banned_peers(db, "run-a")] == ["QmOther"]
        assert lift_bans(db, "run-a", None) == ["QmOther"]
        assert banned_peers(db, "run-a") == [] and len(banned_peers(db, "run-b")) == 1

        # banned again: the newest ban wins, still one row
        record_ban(db, "run-b", "QmRogue", "outlier", 5, ts=40.0)
        assert banned_peers(db, "run-b") == [{"peer_id": "QmRogue", "banned_at": 40.0, "reason": "outlier", "rounds_named": 5}]


def test_a_ban_that_cannot_be_written_is_reported_not_raised(tmp_path):
    path = tmp_path / "p2ptrain.db"
    with Database.open(path) as db:
        db.connection.execute("PRAGMA query_only = ON")  # what a read-only file does to writes (root ignores file modes)
        assert not record_ban(db, "run-a", "QmRogue", "outlier", 3)
        db.connection.execute("PRAGMA query_only = OFF")
        assert banned_peers(db, "run-a") == []
