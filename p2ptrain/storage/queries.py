"""Read-only queries behind the control protocol's ``metrics``, ``epochs``,
``events`` and ``peers`` methods.

Each function takes either the daemon's open ``Database`` or the path of a
database file (opened read-only, e.g. by tools and tests). Given a
``Database``, a query reads what is committed and merges in the rows still
waiting in its write buffer: callers see every row recorded so far, and a
read never makes the database write (the writer alone decides when to flush,
on its interval). Results are lists of plain, JSON-ready dicts, oldest first.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import quote

from .database import Database
from .schema import StorageError

Source = Database | str | Path


def recent_epochs(db: Source, run_id: str | None = None, limit: int = 20) -> list[dict]:
    """The last ``limit`` finished epochs, newest last.

    Args:
        db: the daemon's Database or a database path.
        run_id: only this run's epochs; all runs if None.
        limit: at most this many rows.
    """
    _check_limit(limit)
    where, params = ("WHERE run_id = ?", [run_id]) if run_id else ("", [])
    with _reader(db) as (connection, pending):
        rows = _rows(
            connection,
            f"SELECT * FROM epochs {where} ORDER BY ended_at DESC, epoch DESC LIMIT ?",
            params + [limit],
        )
        extra = [row for row in pending("epochs") if run_id is None or row["run_id"] == run_id]
    # A buffered record of an epoch replaces the stored one.
    by_key = {(row["run_id"], row["epoch"]): row for row in rows + extra}
    return _newest(list(by_key.values()), lambda row: (row["ended_at"], row["epoch"]), limit)


def steps_since(
    db: Source, since: float | None = None, limit: int = 1000, run_id: str | None = None
) -> list[dict]:
    """Step reports of the local worker after ``since``, newest last.

    When more than ``limit`` rows are newer than ``since``, the newest
    ``limit`` are returned (a chart wants the recent end).

    Args:
        db: the daemon's Database or a database path.
        since: only rows with a ts strictly after this Unix time; all if None.
            Pass the last ts you saw to poll without repeats.
        limit: at most this many rows.
        run_id: only this run; all runs if None.
    """
    _check_limit(limit)
    return _time_window(db, "steps", since, limit, run_id)


def events_since(db: Source, since: float | None = None, limit: int = 200) -> list[dict]:
    """Events after ``since`` (``ts``, ``kind``, ``message``, ``data``, ``count``, ``last_ts``), newest last.

    A row may stand for repeats of one event: ``count`` occurrences from ``ts`` to ``last_ts``
    (both NULL in rows written before schema version 7: one occurrence).

    Args:
        db: the daemon's Database or a database path.
        since: only events strictly after this Unix time; all if None.
        limit: at most this many (the newest).
    """
    _check_limit(limit)
    events = _time_window(db, "events", since, limit, None)
    with _reader(db) as (_, pending):
        updates = {(update["ts"], update["kind"]): update for update in pending("event_updates")}
    for event in events:
        event.update(updates.get((event["ts"], event["kind"]), {}))
        event["data"] = _decode(event["data"])
    return events


def peers_table(db: Source, run_id: str, max_age_s: float | None = None) -> list[dict]:
    """The latest row of every peer seen in a run, sorted by peer_id.

    Rows carry the ``peers`` columns, with ``last_seen`` (the snapshot's Unix
    time) instead of ``ts`` and ``compatible`` as a bool (or None).

    Args:
        db: the daemon's Database or a database path.
        run_id: the run.
        max_age_s: leave out peers not seen for this many seconds, measured
            from the newest snapshot of the run; keep all if None.
    """
    with _reader(db) as (connection, pending):
        rows = _rows(
            connection,
            "SELECT * FROM (SELECT *, row_number() OVER "
            "(PARTITION BY peer_id ORDER BY ts DESC, rowid DESC) AS newness "
            "FROM peers WHERE run_id = ?) WHERE newness = 1",
            [run_id],
        )
        extra = [row for row in pending("peers") if row["run_id"] == run_id]
    latest: dict[str, dict] = {}
    for row in rows + extra:
        row.pop("newness", None)
        known = latest.get(row["peer_id"])
        if known is None or row["ts"] >= known["ts"]:
            latest[row["peer_id"]] = row
    newest_ts = max((row["ts"] for row in latest.values()), default=0.0)
    table = []
    for peer_id in sorted(latest):
        row = latest[peer_id]
        if max_age_s is not None and row["ts"] < newest_ts - max_age_s:
            continue
        row["last_seen"] = row.pop("ts")
        if row["compatible"] is not None:
            row["compatible"] = bool(row["compatible"])
        table.append(row)
    return table


def _time_window(
    db: Source, table: str, since: float | None, limit: int, run_id: str | None
) -> list[dict]:
    conditions, params = [], []
    if since is not None:
        conditions.append("ts > ?")
        params.append(since)
    if run_id is not None:
        conditions.append("run_id = ?")
        params.append(run_id)
    where = f"WHERE {' AND '.join(conditions)}" if conditions else ""
    with _reader(db) as (connection, pending):
        rows = _rows(
            connection,
            f"SELECT * FROM {table} {where} ORDER BY ts DESC, rowid DESC LIMIT ?",
            params + [limit],
        )
        extra = [
            row
            for row in pending(table)
            if (since is None or row["ts"] > since) and (run_id is None or row["run_id"] == run_id)
        ]
    return _newest(rows + extra, lambda row: row["ts"], limit)


@contextlib.contextmanager
def _reader(db: Source) -> Iterator[tuple[sqlite3.Connection, Callable[[str], list[dict]]]]:
    """A raw connection to read from, and the buffered rows of a table."""
    if isinstance(db, Database):
        yield db.connection.conn, db.pending_rows
        return
    path = Path(db)
    if not path.exists():
        raise StorageError(
            f"no database at {path}",
            "start the daemon once (it creates the database), or pass the right --home",
        )
    connection = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True)
    try:
        yield connection, lambda table: []
    except sqlite3.DatabaseError as exc:
        raise StorageError(
            f"cannot read the database {path}: {exc}",
            "check the path, or run the daemon once to create and upgrade it",
        ) from exc
    finally:
        connection.close()


def _rows(connection: sqlite3.Connection, sql: str, params: list) -> list[dict]:
    cursor = connection.execute(sql, params)
    names = [column[0] for column in cursor.description]
    return [dict(zip(names, values)) for values in cursor.fetchall()]


def _newest(rows: list[dict], key: Callable[[dict], Any], limit: int) -> list[dict]:
    return sorted(rows, key=key)[-limit:]


def _decode(value: str | None) -> Any:
    return None if value is None else json.loads(value)


def _check_limit(limit: int) -> None:
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ValueError(f"limit must be a positive integer, got {limit!r}")
