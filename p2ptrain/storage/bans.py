"""The ``bans`` table: peers this machine banned from its averaging rounds, per run.

A training worker bans a peer named in several of its rounds
(``p2ptrain.peers.robust.trust``) and reports a ``peer-banned`` event; the daemon
records it here, hands the run's bans to every worker it starts, and lifts them
on ``p2ptrain unban``. Bans are rare and must survive a crash, so they are
written at once, not buffered; when the database cannot be written the ban
still holds in the worker for the rest of its life, and the error is logged.
"""

from __future__ import annotations

import logging
import sqlite3
import time

from .database import Database
from .schema import write_transaction

logger = logging.getLogger(__name__)


def record_ban(db: Database, run_id: str, peer_id: str, reason: str | None, rounds_named: int | None,
               ts: float | None = None) -> bool:
    """Store that ``peer_id`` is banned in ``run_id`` (again: the newest ban wins); True if written.

    Args:
        db: the daemon's database.
        run_id: the run the ban holds in.
        peer_id: the banned peer (base58).
        reason: why it was last named (``robust_reduce``'s reasons), if known.
        rounds_named: in how many rounds it was named, if known.
        ts: Unix time of the ban; now if None.
    """
    row = [run_id, peer_id, time.time() if ts is None else ts, reason, rounds_named]
    try:
        with write_transaction(db.connection.conn):
            db.connection.execute(
                "INSERT OR REPLACE INTO bans (run_id, peer_id, banned_at, reason, rounds_named) VALUES (?, ?, ?, ?, ?)", row)
    except sqlite3.Error as error:
        logger.warning("could not store the ban of %s in %s: %s", peer_id, db.path, error)
        return False
    return True


def banned_peers(db: Database, run_id: str | None) -> list[dict]:
    """The bans of ``run_id`` (none when None), oldest first: ``peer_id``, ``banned_at``, ``reason``, ``rounds_named``."""
    if not run_id:
        return []
    return [dict(row) for row in db.connection.query(
        "SELECT peer_id, banned_at, reason, rounds_named FROM bans WHERE run_id = ? ORDER BY banned_at", [run_id])]


def lift_bans(db: Database, run_id: str | None, peer_ids: list[str] | None) -> list[str]:
    """Delete the bans of ``peer_ids`` (all of ``run_id``'s when None); the peer ids lifted.

    Raises:
        sqlite3.Error: the database cannot be written (the caller says so).
    """
    lifted = [ban["peer_id"] for ban in banned_peers(db, run_id) if peer_ids is None or ban["peer_id"] in peer_ids]
    if lifted:
        with write_transaction(db.connection.conn):
            db.connection.conn.executemany("DELETE FROM bans WHERE run_id = ? AND peer_id = ?", [(run_id, peer_id) for peer_id in lifted])
    return lifted
