"""The tables of the p2ptrain database and the forward migrations that build them.

The schema version lives in SQLite's ``PRAGMA user_version``. ``MIGRATIONS`` is
an ordered tuple of functions; migration ``n`` (1-based) turns a version
``n - 1`` database into a version ``n`` one. A migration is only ever appended,
never edited: a volunteer's database may be any number of versions behind.

JSON columns (``events.data``, ``runs.manifest``, ``settings.value``) hold text
written with ``json.dumps``.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from pathlib import Path
from typing import Callable, Iterator

import sqlite_utils

logger = logging.getLogger(__name__)

BUSY_TIMEOUT_MS = 5000
# After a checkpoint the write-ahead log is cut back to this size: without a
# limit it keeps the size of the largest transaction ever written.
WAL_SIZE_LIMIT_BYTES = 4 << 20
INCREMENTAL_VACUUM = 2  # PRAGMA auto_vacuum's value for INCREMENTAL


class StorageError(Exception):
    """The database cannot be used as it is.

    Args:
        message: what happened, in one line.
        fix: what the user can do about it, in one line.
    """

    def __init__(self, message: str, fix: str = ""):
        super().__init__(f"{message} ({fix})" if fix else message)
        self.message = message
        self.fix = fix

    def one_line(self) -> str:
        return str(self)


class SchemaTooNewError(StorageError):
    """The database was written by a newer p2ptrain than the one running."""


# Columns of a `peers` row besides ts and run_id, in the order of PeerRow.
PEER_COLUMNS = (
    "peer_id",
    "nickname",
    "device",
    "precision",
    "quantization",
    "micro_batch",
    "samples_per_second",
    "epoch",
    "loss",
    "reachability",
    "compatible",
    "trained_samples",
    "contributed_samples",
)


def _v1_tables(db: sqlite_utils.Database) -> None:
    """The tables as the design first named them (docs/design.md, "Storage", has them all)."""
    db["events"].create({"ts": float, "kind": str, "message": str, "data": str})
    db["steps"].create(
        {
            "ts": float,
            "run_id": str,
            "epoch": int,
            "loss": float,
            "samples": int,
            "samples_per_second": float,
        }
    )
    db["epochs"].create(
        {
            "run_id": str,
            "epoch": int,
            "started_at": float,
            "ended_at": float,
            "duration_s": float,
            "num_peers": int,
            "global_samples": int,
            "loss": float,
        },
        pk=("run_id", "epoch"),
    )
    db["peers"].create(
        {
            "ts": float,
            "run_id": str,
            "peer_id": str,
            "nickname": str,
            "device": str,
            "samples_per_second": float,
            "epoch": int,
            "loss": float,
        }
    )
    db["runs"].create(
        {"run_id": str, "manifest": str, "joined_at": float, "left_at": float},
        pk="run_id",
    )
    db["settings"].create({"key": str, "value": str}, pk="key")


def _v2_validation_plan_and_indexes(db: sqlite_utils.Database) -> None:
    """Validation loss per epoch, each peer's plan and reachability, and the
    indexes the TUI's time-window queries need."""
    db["epochs"].add_column("val_loss", float)
    for column, column_type in (
        ("precision", str),
        ("quantization", str),
        ("micro_batch", int),
        ("reachability", str),
        ("compatible", int),
    ):
        db["peers"].add_column(column, column_type)
    db["events"].create_index(["ts"])
    db["steps"].create_index(["ts"])
    db["steps"].create_index(["run_id", "ts"])
    db["peers"].create_index(["ts"])
    db["peers"].create_index(["run_id", "peer_id", "ts"])
    db["epochs"].create_index(["ended_at"])


def _v3_step_worker(db: sqlite_utils.Database) -> None:
    """Which local worker (``gpu1``, ``cpu``) reported each step, as a daemon
    runs one worker per GPU; older rows keep NULL."""
    db["steps"].add_column("worker", str)


def _v4_folded_steps(db: sqlite_utils.Database) -> None:
    """Step rows older than a day are folded into one row per minute
    (``storage/retention.py``); ``reports`` says how many step reports such a
    row stands for (NULL: one report, as written). ``connect`` also turns on
    incremental vacuum, which SQLite cannot do inside this transaction."""
    db["steps"].add_column("reports", int)


def _v5_peer_samples(db: sqlite_utils.Database) -> None:
    """Each peer's samples in the run: all it trained, and those that entered an
    adopted average or optimizer step (``peers/training/sample_account.py``); older rows keep NULL."""
    db["peers"].add_column("trained_samples", int)
    db["peers"].add_column("contributed_samples", int)


def _v6_bans(db: sqlite_utils.Database) -> None:
    """Peers this machine banned from its averaging rounds (``storage/bans.py``),
    per run, until ``p2ptrain unban``."""
    db["bans"].create(
        {"run_id": str, "peer_id": str, "banned_at": float, "reason": str, "rounds_named": int},
        pk=("run_id", "peer_id"),
    )


def _v7_event_repeats(db: sqlite_utils.Database) -> None:
    """A row of ``events`` may stand for repeats of one event (``daemon/event_bursts.py``):
    ``count`` occurrences from ``ts`` to ``last_ts``; rows written before keep NULL (one)."""
    db["events"].add_column("count", int)
    db["events"].add_column("last_ts", float)


MIGRATIONS: tuple[Callable[[sqlite_utils.Database], None], ...] = (
    _v1_tables,
    _v2_validation_plan_and_indexes,
    _v3_step_worker,
    _v4_folded_steps,
    _v5_peer_samples,
    _v6_bans,
    _v7_event_repeats,
)
SCHEMA_VERSION = len(MIGRATIONS)


@contextlib.contextmanager
def write_transaction(connection: sqlite3.Connection) -> Iterator[None]:
    """One write transaction that takes the write lock at once (``BEGIN IMMEDIATE``).

    The daemon's writer and the retention thread share the file: a deferred
    transaction that read first and then writes fails at once with "database
    is locked" if the other wrote in between (no busy wait can help it); an
    immediate one waits its turn (``BUSY_TIMEOUT_MS``).

    Args:
        connection: the raw sqlite3 connection, not inside a transaction.
    """
    connection.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise
    connection.execute("COMMIT")


def schema_version(db: sqlite_utils.Database) -> int:
    """The schema version recorded in the database (0 for a new, empty file).

    Args:
        db: an open sqlite-utils database.
    """
    return db.execute("PRAGMA user_version").fetchone()[0]


def migrate(db: sqlite_utils.Database, path: str) -> list[int]:
    """Bring the database up to ``SCHEMA_VERSION``; return the versions applied.

    Each migration runs in its own ``BEGIN IMMEDIATE`` transaction together
    with the version bump, so a crash leaves the database at the previous
    version, never half-migrated; the version is re-read inside the
    transaction so two processes opening at once do not both migrate.

    Args:
        db: an open sqlite-utils database.
        path: the database file, only used in error messages.

    Raises:
        SchemaTooNewError: the database is newer than this code knows.
        StorageError: a migration could not be written (read-only file,
            full disk).
    """
    found = schema_version(db)
    if found > SCHEMA_VERSION:
        raise _too_new(path, found)
    applied = []
    for version in range(found + 1, SCHEMA_VERSION + 1):
        try:
            db.conn.execute("BEGIN IMMEDIATE")
            try:
                current = schema_version(db)
                if current > SCHEMA_VERSION:
                    raise _too_new(path, current)
                if current < version:
                    MIGRATIONS[version - 1](db)
                    db.execute(f"PRAGMA user_version = {version}")
                    applied.append(version)
            except BaseException:
                db.rollback()
                raise
            db.conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise StorageError(
                f"cannot upgrade the database {path} to schema version {version}: {exc}",
                f"make {path} and its directory writable by this user and free some disk space",
            ) from exc
    return applied


def _too_new(path: str, found: int) -> SchemaTooNewError:
    return SchemaTooNewError(
        f"the database {path} has schema version {found}, "
        f"but this p2ptrain only knows up to version {SCHEMA_VERSION}",
        "upgrade p2ptrain (pip install -U p2ptrain), or move the database aside "
        "to start a fresh one",
    )


def connect(path: Path) -> sqlite_utils.Database:
    """Open a database file in WAL mode with the writer's pragmas, and migrate it.

    Args:
        path: the database file; created if missing (its directory must exist).

    Raises:
        SchemaTooNewError, StorageError: as ``migrate``, or the file cannot
            be opened or is not a SQLite database.
    """
    connection = None
    try:
        connection = sqlite_utils.Database(path, execute_plugins=False)
        # busy_timeout first: the other pragmas may already need the lock.
        connection.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        connection.execute("PRAGMA synchronous = NORMAL")
        connection.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT_BYTES}")
        if schema_version(connection) == 0:
            # Before the first table: no VACUUM needed to take effect.
            connection.execute(f"PRAGMA auto_vacuum = {INCREMENTAL_VACUUM}")
        if connection.journal_mode != "wal":
            connection.enable_wal()
    except sqlite3.DatabaseError as exc:
        error_name = getattr(exc, "sqlite_errorname", "") or ""
        if connection is not None and error_name.startswith("SQLITE_READONLY"):
            # A read-only file not in WAL mode yet: still readable, and the
            # writer reports the problem when it tries to write.
            return _migrated(connection, path)
        if connection is not None:
            connection.close()
        if error_name in ("SQLITE_NOTADB", "SQLITE_CORRUPT"):
            fix = f"move it aside (mv {path} {path}.broken) and p2ptrain starts a fresh one"
        else:
            fix = f"make {path} and {path.parent} readable and writable by this user"
        raise StorageError(f"cannot open the database {path}: {exc}", fix) from exc
    return _migrated(connection, path)


def _migrated(connection: sqlite_utils.Database, path: Path) -> sqlite_utils.Database:
    try:
        migrate(connection, str(path))
    except BaseException:
        connection.close()
        raise
    _use_incremental_vacuum(connection, path)
    return connection


def _use_incremental_vacuum(connection: sqlite_utils.Database, path: Path) -> None:
    """Let retention give freed pages back to the file system (``PRAGMA
    incremental_vacuum``): without it a database never shrinks.

    A database made before schema version 4 needs one full VACUUM to switch
    (it rewrites the file; atomic, so a crash leaves the old file). A file
    that cannot be written keeps its mode, and the next open tries again.
    """
    if connection.execute("PRAGMA auto_vacuum").fetchone()[0] == INCREMENTAL_VACUUM:
        return
    try:
        connection.execute(f"PRAGMA auto_vacuum = {INCREMENTAL_VACUUM}")
        connection.execute("VACUUM")
        logger.info("compacted %s once to let it shrink as old rows go", path)
    except sqlite3.Error as exc:
        logger.warning("cannot switch %s to incremental vacuum yet: %s", path, exc)
