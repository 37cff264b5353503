"""The daemon's SQLite writer: buffered rows, flushed in one transaction a batch.

The daemon's event loop is the only writer. Metrics arrive about once a second
per peer, so rows wait in memory and ``flush()`` writes them in one
transaction: a killed daemon loses at most the unflushed batch, never the
database (WAL mode; a transaction is either all there or not at all).

A full disk or a read-only file never raises out of a write: the rows stay
buffered (bounded; the oldest step rows go first), ``last_write_error`` says
what is wrong, and the next flush tries again.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
import time
from pathlib import Path
from typing import Any, Callable

import sqlite_utils

from p2ptrain.worker_pipe import PeerRow

from .buffer import WriteBuffer
from .disk_full import disk_full_message
from .retention import RetentionLimits, apply_retention
from .schema import PEER_COLUMNS, StorageError, connect

logger = logging.getLogger(__name__)


class Database:
    """The p2ptrain database, opened for writing by the daemon.

    Use ``Database.open(path)``; the constructor is for that method only.
    Every ``record_*`` call ends with ``maybe_flush()``; the daemon also calls
    ``maybe_flush()`` on its tick, so rows never wait long for the next
    record, and ``close()`` on shutdown.

    Attributes:
        path: the database file.
        connection: the underlying ``sqlite_utils.Database``; read it only
            through ``p2ptrain.storage.queries``.
        last_write_error: why the last flush failed, in one line with a fix,
            or None when writing works. The daemon shows it as a health line.
        dropped_rows: rows thrown away because the buffer was full while
            the database could not be written.
    """

    def __init__(
        self,
        path: Path,
        connection: sqlite_utils.Database,
        flush_interval_s: float,
        max_batch: int,
        max_buffered_rows: int,
        clock: Callable[[], float],
    ):
        self.path = path
        self.connection = connection
        self.flush_interval_s = flush_interval_s
        self.max_batch = max_batch
        self.max_buffered_rows = max_buffered_rows
        self._clock = clock
        self._buffer = WriteBuffer()
        self._oldest_buffered_at: float | None = None
        self._retry_at = 0.0
        self._reconnect_needed = False
        self._closed = False
        self.last_write_error: str | None = None
        self.dropped_rows = 0

    @classmethod
    def open(
        cls,
        path: str | Path,
        *,
        flush_interval_s: float = 2.0,
        max_batch: int = 500,
        max_buffered_rows: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> Database:
        """Open (creating it and its directory if needed) and migrate a database.

        Args:
            path: the database file, usually ``Paths.database``.
            flush_interval_s: ``maybe_flush()`` writes buffered rows once the
                oldest has waited this long. Longer means fewer disk writes
                and more rows lost if the daemon is killed.
            max_batch: ``maybe_flush()`` writes as soon as this many rows are
                buffered, whatever their age.
            max_buffered_rows: while the database cannot be written, keep at
                most this many rows in memory; beyond it the oldest step rows
                are dropped first, then peer snapshots, then events (epochs,
                runs and settings are never dropped).
            clock: a monotonic clock in seconds, for the flush timing.

        Raises:
            SchemaTooNewError: the file was written by a newer p2ptrain.
            StorageError: the file or its directory cannot be created, the
                file is not a SQLite database, or it needs a migration and
                cannot be written.
        """
        if flush_interval_s < 0 or max_batch < 1 or max_buffered_rows < 1:
            raise ValueError(
                "flush_interval_s must be >= 0, max_batch and max_buffered_rows >= 1"
            )
        path = Path(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(
                f"cannot create the directory of the database {path}: {exc}",
                f"create {path.parent} and make it writable by this user",
            ) from exc
        connection = connect(path)
        return cls(path, connection, flush_interval_s, max_batch, max_buffered_rows, clock)

    @property
    def buffered_rows(self) -> int:
        """How many rows wait for the next flush."""
        return len(self._buffer)

    def record_event(
        self, kind: str, message: str, data: Any = None, ts: float | None = None, count: int = 1,
        last_ts: float | None = None,
    ) -> None:
        """Buffer an event (state change, error, join, pause...).

        Args:
            kind: a short machine-readable word, e.g. ``state`` or ``worker-crash``.
            message: one line for humans.
            data: anything JSON-serialisable that goes with it, or None.
            ts: Unix time of the event; now if None.
            count, last_ts: a row of repeats stands for ``count`` occurrences from ``ts`` to
                ``last_ts`` (``ts`` if None); ``update_event`` changes them later.
        """
        ts = _now(ts)
        row = {"ts": ts, "kind": kind, "message": message, "data": _json(data), "count": count,
               "last_ts": ts if last_ts is None else last_ts}
        self._buffer.events.append(row)
        self._buffered()

    def update_event(self, ts: float, kind: str, count: int, last_ts: float, message: str, data: Any = None) -> None:
        """Update the row of repeats ``record_event`` wrote with ``ts`` and ``kind``: its ``count``,
        ``last_ts``, and the latest occurrence's ``message`` and ``data``."""
        self._buffer.update_event({"ts": ts, "kind": kind, "count": count, "last_ts": last_ts,
                                   "message": message, "data": _json(data)})
        self._buffered()

    def record_step(
        self,
        run_id: str,
        epoch: int,
        loss: float | None,
        samples: int,
        samples_per_second: float,
        ts: float | None = None,
        worker: str | None = None,
    ) -> None:
        """Buffer one step report of a local training worker.

        Args:
            run_id: the run the worker trains in.
            epoch: this peer's epoch at the report (its local epoch: behind the swarm's until it catches up).
            loss: mean training loss over the report, or None if unknown.
            samples: samples processed since the previous report.
            samples_per_second: the local throughput over the report.
            ts: Unix time of the report; now if None.
            worker: the reporting worker's name (``gpu1``, ``cpu``; see
                ``daemon/worker_slots.py``), so several workers' rows can be told
                apart; None if unknown (rows written before schema version 3).
        """
        self._buffer.steps.append(
            {
                "ts": _now(ts),
                "run_id": run_id,
                "epoch": epoch,
                "loss": _finite(loss),
                "samples": samples,
                "samples_per_second": _finite(samples_per_second),
                "worker": worker,
            }
        )
        self._buffered()

    def record_epoch(
        self,
        run_id: str,
        epoch: int,
        started_at: float,
        ended_at: float,
        duration_s: float,
        num_peers: int,
        global_samples: int,
        loss: float | None,
        val_loss: float | None = None,
    ) -> None:
        """Buffer the end of an epoch; a second record of the same (run_id,
        epoch) replaces the first.

        Args:
            run_id: the run.
            epoch: the epoch that ended.
            started_at: Unix time the epoch started.
            ended_at: Unix time it ended.
            duration_s: its wall-clock length in seconds.
            num_peers: peers that took part.
            global_samples: samples accumulated across the swarm.
            loss: mean training loss of the epoch.
            val_loss: validation loss measured after the epoch, if any.
        """
        self._buffer.epochs[(run_id, epoch)] = {
            "run_id": run_id,
            "epoch": epoch,
            "started_at": started_at,
            "ended_at": ended_at,
            "duration_s": duration_s,
            "num_peers": num_peers,
            "global_samples": global_samples,
            "loss": _finite(loss),
            "val_loss": _finite(val_loss),
        }
        self._buffered()

    def record_peers(self, run_id: str, rows: list[PeerRow], ts: float | None = None) -> None:
        """Buffer a snapshot of the swarm: one row per peer.

        Args:
            run_id: the run the snapshot belongs to.
            rows: the peers; fields outside the ``peers`` table
                (``manifest_hash``, ``is_local``...) are not stored.
                Each needs a ``peer_id``.
            ts: Unix time of the snapshot; now if None.
        """
        ts = _now(ts)
        for row in rows:
            if not row.peer_id:
                raise ValueError(f"peer row without a peer_id: {row!r}")
        for row in rows:
            stored = {"ts": ts, "run_id": run_id}
            stored.update({column: getattr(row, column) for column in PEER_COLUMNS})
            for column in ("loss", "samples_per_second"):
                stored[column] = _finite(stored[column])
            if stored["compatible"] is not None:
                stored["compatible"] = int(bool(stored["compatible"]))
            self._buffer.peers.append(stored)
        self._buffered()

    def record_run_joined(self, run_id: str, manifest: dict, ts: float | None = None) -> None:
        """Buffer that this machine joined a run (again, if it had left it).

        Args:
            run_id: the run.
            manifest: the run manifest as read from the DHT.
            ts: Unix time of the join; now if None.
        """
        self._buffer.run_changes.append(
            {"run_id": run_id, "manifest": _json(manifest), "joined_at": _now(ts), "left_at": None}
        )
        self._buffered()

    def record_run_left(self, run_id: str, ts: float | None = None) -> None:
        """Buffer that this machine left a run.

        Args:
            run_id: the run.
            ts: Unix time it left; now if None.
        """
        self._buffer.run_changes.append({"run_id": run_id, "left_at": _now(ts)})
        self._buffered()

    def pending_rows(self, table: str) -> list[dict]:
        """Copies of the buffered rows of a table, as they will be stored.

        For ``runs`` these are changes in order: a row with ``joined_at`` is a
        join (the whole row), one without is a leave (``run_id``, ``left_at``).

        Args:
            table: ``steps``, ``peers``, ``events``, ``epochs``, ``runs``,
                ``settings`` or ``event_updates`` (new counts of stored rows of
                repeats, by ``ts`` and ``kind``).
        """
        return self._buffer.rows(table)

    def get_setting(self, key: str, default: Any = None) -> Any:
        """A stored setting (JSON-decoded), or ``default`` if it was never set.

        Args:
            key: the setting's name, e.g. ``desired_state``.
            default: returned when the key is absent.
        """
        if key in self._buffer.settings:
            return json.loads(self._buffer.settings[key])
        row = self.connection.execute("SELECT value FROM settings WHERE key = ?", [key]).fetchone()
        return default if row is None else json.loads(row[0])

    def set_setting(self, key: str, value: Any) -> bool:
        """Store a setting now (with any buffered rows), so it survives a crash.

        If the database cannot be written the value is kept and retried with
        the next flush; ``get_setting`` already returns it. Returns whether it
        reached the disk.

        Args:
            key: the setting's name.
            value: anything JSON-serialisable.
        """
        self._buffer.settings[key] = json.dumps(value)
        self._buffered(flush=False)
        return self.flush()

    def maybe_flush(self) -> bool:
        """Flush if the oldest buffered row waited ``flush_interval_s`` or
        ``max_batch`` rows wait; after a failed flush, wait
        ``flush_interval_s`` before trying again. Returns whether it wrote."""
        if not self.buffered_rows or self._closed:
            return False
        now = self._clock()
        if now < self._retry_at:
            return False
        too_old = now - self._oldest_buffered_at >= self.flush_interval_s
        if too_old or self.buffered_rows >= self.max_batch:
            return self.flush()
        return False

    def flush(self) -> bool:
        """Write every buffered row in one transaction. Never raises a
        database error: on failure the rows stay buffered and
        ``last_write_error`` is set. Returns whether the rows are on disk."""
        if not self.buffered_rows:
            return True
        if self._closed:
            return False
        try:
            if self._reconnect_needed:
                self._reconnect()
            self._buffer.write(self.connection)
        except (sqlite3.Error, StorageError) as exc:
            self._write_failed(exc)
            return False
        self._buffer.clear()
        self._oldest_buffered_at = None
        self._retry_at = 0.0
        if self.last_write_error is not None:
            logger.info("writing to %s works again", self.path)
        self.last_write_error = None
        return True

    def apply_retention(self, limits: RetentionLimits, now: float | None = None) -> dict[str, int] | None:
        """Flush, then apply ``limits`` on this connection (``storage/retention.py``:
        old steps folded per minute then deleted, surplus events and old peer
        snapshots deleted, the file shrunk). The daemon runs retention in a
        ``RetentionThread`` instead, off its event loop.

        Returns the counts of ``retention.apply_retention``, or None if the
        database could not be written (``last_write_error`` says why).

        Args:
            limits: what to keep.
            now: Unix time to measure ages from; the current time if None.
        """
        if not self.flush():
            return None
        try:
            return apply_retention(self.connection.conn, limits, now)
        except sqlite3.Error as exc:
            self._write_failed(exc)
            return None

    def close(self) -> bool:
        """Flush and close. Returns whether every buffered row was written."""
        if self._closed:
            return not self.buffered_rows
        written = self.flush()
        if not written:
            logger.warning("closing %s with %d rows unwritten", self.path, self.buffered_rows)
        self._closed = True
        self.connection.close()
        return written

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _buffered(self, flush: bool = True) -> None:
        if self._oldest_buffered_at is None:
            self._oldest_buffered_at = self._clock()
        self.dropped_rows += self._buffer.drop_overflow(self.max_buffered_rows)
        if flush:
            self.maybe_flush()

    def _write_failed(self, exc: Exception) -> None:
        error_name = getattr(exc, "sqlite_errorname", "") or ""
        if isinstance(exc, StorageError):
            message = exc.one_line()
        elif error_name == "SQLITE_FULL":
            message = disk_full_message(self.path, self.buffered_rows)
        else:
            message = (
                f"cannot write the database {self.path}: {exc} "
                f"({self.buffered_rows} rows waiting; free disk space and make "
                f"{self.path} and its directory writable by this user)"
            )
            # A connection opened on a read-only file stays read-only, even
            # once the file is writable again: open a new one next time.
            if error_name.startswith("SQLITE_READONLY"):
                self._reconnect_needed = True
        if self.last_write_error is None:
            logger.warning("%s", message)
        self.last_write_error = message
        self._retry_at = self._clock() + self.flush_interval_s

    def _reconnect(self) -> None:
        # Open the new connection first: if that fails, reads keep working.
        fresh = connect(self.path)
        self.connection.close()
        self.connection = fresh
        self._reconnect_needed = False


def _now(ts: float | None) -> float:
    return time.time() if ts is None else ts


def _finite(value: float | None) -> float | None:
    # SQLite stores NaN as NULL anyway; doing it here keeps buffered rows
    # identical to stored ones, and both JSON-ready.
    return value if value is not None and math.isfinite(value) else None


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value)
