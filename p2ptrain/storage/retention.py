"""Keeping the database small over months of training.

A worker reports a step about once a second: ~86,000 ``steps`` rows a day.
Retention keeps the last day as written, folds older steps into one row per
minute (per run and worker: samples summed, loss and samples/s averaged over
the reports), deletes steps older than ``keep_steps_days``, thins peer
snapshots older than an hour to one per peer per 10 minutes and deletes them
after ``keep_peers_days``, keeps only the newest ``keep_events`` events,
thins epochs older than two days to the last of each run per hour, then
gives the freed pages back to the file system (incremental vacuum and a
truncating WAL checkpoint), so the file really shrinks. Runs and settings
are kept forever.

Epochs: a sync run's epochs come every 8-40 s in the project's own runs (a
DiLoCo round's every few minutes): at 20 s that is 4,320 rows a day, 1.6 M a
year, kept forever before. What reads them wants recent ones: ``p2ptrain
epochs`` the last 20, the TUI's epoch chart the last 200 (its history at most
1,000: under 12 hours even at 40 s an epoch), so the last
``THIN_EPOCHS_AFTER_S`` (two days, a weekend's gap in looking included) stay as
written. Older ones keep the run's last epoch of each hour (its loss, peers
and samples then): 24 rows a day, about 8,800 a year per run whatever the
epoch rate, a loss history at an hour's resolution that is never deleted.

Work goes in short transactions (an hour of steps, or ``DELETE_BATCH`` rows,
each), because the daemon's writer shares the file: it waits for at most one
of them. ``RetentionThread`` runs it in the daemon off the event loop, when
the daemon starts and then periodically.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .schema import StorageError, connect, write_transaction

logger = logging.getLogger(__name__)

DAY_S = 86400.0
FOLD_AFTER_S = DAY_S  # steps younger than this stay one row per report
FOLD_S = 60  # older ones become one row per this many seconds
FOLD_CHUNK_S = 3600  # steps folded per transaction
THIN_PEERS_AFTER_S = 3600.0  # peer snapshots younger than this are all kept
THIN_PEERS_S = 600  # older ones: the last snapshot of each peer per this many seconds
THIN_CHUNK_S = DAY_S  # peer snapshots thinned per transaction (a pass goes over all of them: few transactions)
THIN_EPOCHS_AFTER_S = 2 * DAY_S  # epochs that ended later than this ago are all kept (the module docstring says why)
THIN_EPOCHS_S = 3600  # older ones: each run's last epoch per this many seconds
DELETE_BATCH = 20_000  # rows deleted per transaction
VACUUM_BATCH_PAGES = 2_000  # pages given back per transaction
MAX_INTERVAL_S = 3600.0
MIN_INTERVAL_S = 5.0


@dataclass(frozen=True)
class RetentionLimits:
    """How much history the database keeps.

    Attributes:
        keep_steps_days: step rows older than this are deleted (rows older
            than a day are already folded to one per minute).
        keep_events: only this many newest events are kept.
        keep_peers_days: peer snapshots older than this are deleted.
    """

    keep_steps_days: float = 30.0
    keep_events: int = 100_000
    keep_peers_days: float = 7.0

    def __post_init__(self) -> None:
        if self.keep_steps_days < 0 or self.keep_events < 0 or self.keep_peers_days < 0:
            raise ValueError("retention limits must be >= 0")

    def interval_s(self) -> float:
        """How often to apply them: hourly, or four times per ``keep_steps_days``
        when that is shorter (so no row outlives it by more than a quarter)."""
        return min(MAX_INTERVAL_S, max(MIN_INTERVAL_S, self.keep_steps_days * DAY_S / 4))


def apply_retention(connection: sqlite3.Connection, limits: RetentionLimits, now: float | None = None) -> dict[str, int]:
    """Fold, delete and vacuum as the module docstring says; returns counts.

    Args:
        connection: a writable connection to a migrated p2ptrain database, in
            autocommit mode (``isolation_level = None``): each step opens its
            own transaction.
        limits: what to keep.
        now: Unix time to measure ages from; the current time if None.

    Returns:
        ``{"folded": step rows folded, "steps": step rows deleted, "events":
        ..., "peers": ..., "pages_freed": pages given back to the file system}``.

    Raises:
        sqlite3.Error: the database could not be written; what is done stays done.
    """
    now = time.time() if now is None else now
    keep_steps_s = limits.keep_steps_days * DAY_S
    steps_cutoff = now - keep_steps_s
    deleted_steps = _delete_in_batches(connection, "steps", "ts < ?", [steps_cutoff])
    folded = _fold_steps(connection, max(now - FOLD_AFTER_S, steps_cutoff))
    peers = _delete_in_batches(connection, "peers", "ts < ?", [now - limits.keep_peers_days * DAY_S])
    peers += _thin(connection, "peers", "ts", "run_id, peer_id", THIN_PEERS_S, now - THIN_PEERS_AFTER_S)
    epochs = _thin(connection, "epochs", "ended_at", "run_id", THIN_EPOCHS_S, now - THIN_EPOCHS_AFTER_S)
    events = _delete_surplus_events(connection, limits.keep_events)
    pages = _give_back_free_pages(connection)
    return {"folded": folded, "steps": deleted_steps, "events": events, "peers": peers, "epochs": epochs,
            "pages_freed": pages}


def _fold_steps(connection: sqlite3.Connection, before: float) -> int:
    """Fold the step reports older than ``before`` into per-minute rows; returns how many rows went."""
    end = (before // FOLD_S) * FOLD_S  # whole minutes only: a minute is folded once, all at once
    folded = 0
    start = float("-inf")
    while True:
        # the oldest report not folded yet (folded rows have ``reports`` set)
        row = connection.execute(
            "SELECT MIN(ts) FROM steps WHERE ts >= ? AND ts < ? AND reports IS NULL", [start, end]
        ).fetchone()
        if row[0] is None:
            return folded
        start = (row[0] // FOLD_S) * FOLD_S
        stop = min(end, start + FOLD_CHUNK_S)
        with write_transaction(connection):
            last_rowid = connection.execute("SELECT MAX(rowid) FROM steps").fetchone()[0]
            # a folded row already in these minutes (a late report) is folded again with its weight
            connection.execute(
                f"""INSERT INTO steps (ts, run_id, epoch, loss, samples, samples_per_second, worker, reports)
                SELECT CAST(ts / {FOLD_S} AS INTEGER) * {FOLD_S}, run_id, MAX(epoch),
                    SUM(loss * COALESCE(reports, 1))
                        / SUM(CASE WHEN loss IS NULL THEN 0 ELSE COALESCE(reports, 1) END),
                    SUM(samples),
                    SUM(samples_per_second * COALESCE(reports, 1))
                        / SUM(CASE WHEN samples_per_second IS NULL THEN 0 ELSE COALESCE(reports, 1) END),
                    worker, SUM(COALESCE(reports, 1))
                FROM steps WHERE ts >= ? AND ts < ?
                GROUP BY run_id, worker, CAST(ts / {FOLD_S} AS INTEGER)""",
                [start, stop],
            )
            folded += connection.execute(
                "DELETE FROM steps WHERE ts >= ? AND ts < ? AND rowid <= ?", [start, stop, last_rowid]
            ).rowcount
        start = stop


def _thin(connection: sqlite3.Connection, table: str, ts: str, keys: str, every_s: int, before: float) -> int:
    """Keep the last row written of each ``keys`` group per ``every_s`` seconds of ``ts`` before
    ``before`` (peer snapshots: the worker sends the whole swarm every few seconds, with ten peers
    170,000 rows a day; epochs: every 8-40 s); returns how many rows went."""
    end = (before // every_s) * every_s
    oldest = connection.execute(f"SELECT MIN({ts}) FROM {table} WHERE {ts} < ?", [end]).fetchone()[0]
    if oldest is None:
        return 0
    deleted = 0
    start = (oldest // every_s) * every_s
    while start < end:
        stop = min(end, start + THIN_CHUNK_S)
        with write_transaction(connection):
            deleted += connection.execute(
                f"""DELETE FROM {table} WHERE {ts} >= :start AND {ts} < :stop AND rowid NOT IN (
                    SELECT MAX(rowid) FROM {table} WHERE {ts} >= :start AND {ts} < :stop
                    GROUP BY {keys}, CAST({ts} / {every_s} AS INTEGER))""",
                {"start": start, "stop": stop},
            ).rowcount
        start = stop
    return deleted


def _delete_in_batches(connection: sqlite3.Connection, table: str, where: str, params: list) -> int:
    deleted = 0
    while True:
        with write_transaction(connection):
            count = connection.execute(
                f"DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} WHERE {where} LIMIT {DELETE_BATCH})",
                params,
            ).rowcount
        deleted += count
        if count < DELETE_BATCH:
            return deleted


def _delete_surplus_events(connection: sqlite3.Connection, keep: int) -> int:
    # rowid order is insertion order, which is time order for events
    row = connection.execute("SELECT rowid FROM events ORDER BY rowid DESC LIMIT 1 OFFSET ?", [keep]).fetchone()
    if row is None:
        return 0
    return _delete_in_batches(connection, "events", "rowid <= ?", [row[0]])


def _give_back_free_pages(connection: sqlite3.Connection) -> int:
    """Move free pages to the end of the file and cut them off, then fold the
    write-ahead log into the file and truncate it; returns the pages freed."""
    freed = 0
    while True:
        free = connection.execute("PRAGMA freelist_count").fetchone()[0]
        if not free:
            break
        connection.execute(f"PRAGMA incremental_vacuum({VACUUM_BATCH_PAGES})").fetchall()
        after = connection.execute("PRAGMA freelist_count").fetchone()[0]
        freed += free - after
        if after >= free:  # auto_vacuum is off (the switch has not happened yet): nothing to give back
            break
    connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    return freed


class RetentionThread:
    """Applies retention to the daemon's database in a background thread:
    at once, then every ``limits().interval_s()`` seconds.

    It uses its own connection, so the event loop never waits for it, except
    for the database lock during one short transaction.

    Args:
        path: the database file.
        limits: called before each pass, so a changed config applies at the next one.
    """

    def __init__(self, path: Path, limits: Callable[[], RetentionLimits]):
        self.path = path
        self.limits = limits
        self.last_result: dict[str, int] | None = None
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="p2ptrain-retention", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask the thread to end after its current transaction, and wait for it."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        database = None
        while not self._stop.is_set():
            interval_s = MAX_INTERVAL_S  # until the limits are read
            try:
                limits = self.limits()
                interval_s = limits.interval_s()
                if database is None:
                    database = connect(self.path)
                    database.conn.isolation_level = None
                started = time.monotonic()
                self.last_result = apply_retention(database.conn, limits)
                self.last_error = None
                logger.info("retention: %s in %.2f s", self.last_result, time.monotonic() - started)
            except (sqlite3.Error, StorageError) as error:
                if self.last_error is None:
                    logger.warning("retention could not run on %s: %s", self.path, error)
                self.last_error = str(error)
            except Exception as error:  # e.g. a limit the config holds that is no number: the next pass may do
                logger.exception("retention pass failed")
                self.last_error = str(error)
            self._stop.wait(interval_s)
        if database is not None:
            database.close()
