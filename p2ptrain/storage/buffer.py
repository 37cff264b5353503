"""Rows waiting to be written, in the shape of their tables.

``Database`` decides when to write; this module holds what waits, bounds it,
and writes it in one transaction.
"""

from __future__ import annotations

from collections import deque

import sqlite_utils

from .schema import write_transaction


class WriteBuffer:
    """Buffered rows per table.

    Attributes:
        steps, peers, events: rows to insert, oldest first.
        epochs: epoch rows keyed by (run_id, epoch); a later record of the
            same epoch replaces the earlier one.
        event_updates: new ``count``, ``last_ts``, ``message`` and ``data`` of
            stored event rows of repeats, keyed by the row's (ts, kind).
        run_changes: joins (whole ``runs`` rows, with ``joined_at``) and
            leaves (``run_id``, ``left_at``), in the order they happened.
        settings: JSON text per setting key.
    """

    def __init__(self) -> None:
        self.steps: deque[dict] = deque()
        self.peers: deque[dict] = deque()
        self.events: deque[dict] = deque()
        self.epochs: dict[tuple[str, int], dict] = {}
        self.event_updates: dict[tuple[float, str], dict] = {}
        self.run_changes: list[dict] = []
        self.settings: dict[str, str] = {}

    def __len__(self) -> int:
        return (
            len(self.steps)
            + len(self.peers)
            + len(self.events)
            + len(self.epochs)
            + len(self.event_updates)
            + len(self.run_changes)
            + len(self.settings)
        )

    def rows(self, table: str) -> list[dict]:
        """Copies of the buffered rows of one table (see ``Database.pending_rows``).

        Args:
            table: ``steps``, ``peers``, ``events``, ``epochs``, ``runs`` or
                ``settings``.
        """
        buffers = {
            "steps": self.steps,
            "peers": self.peers,
            "events": self.events,
            "epochs": self.epochs.values(),
            "event_updates": self.event_updates.values(),
            "runs": self.run_changes,
            "settings": [{"key": key, "value": value} for key, value in self.settings.items()],
        }
        return [dict(row) for row in buffers[table]]

    def update_event(self, update: dict) -> None:
        """A new count (and span, message, data) of the event row with ``update``'s ts and kind:
        applied to the row itself while it waits here, else written with the next batch."""
        for row in self.events:
            if (row["ts"], row["kind"]) == (update["ts"], update["kind"]):
                row.update(update)
                return
        self.event_updates[(update["ts"], update["kind"])] = update

    def drop_overflow(self, max_rows: int) -> int:
        """Drop rows until at most ``max_rows`` remain; return how many went.

        Steps go first (the most numerous, and epochs summarise them), then
        peer snapshots (repeated every few seconds anyway), then events;
        epochs, runs and settings are never dropped.

        Args:
            max_rows: the bound on buffered rows.
        """
        dropped = 0
        while len(self) > max_rows:
            droppable = next((b for b in (self.steps, self.peers, self.events) if b), None)
            if droppable is None:
                break
            droppable.popleft()
            dropped += 1
        return dropped

    def write(self, db: sqlite_utils.Database) -> None:
        """Write every buffered row in one transaction; the buffer is left as
        it was (``clear()`` it once this returns).

        Args:
            db: the open database to write to.
        """
        with write_transaction(db.conn):
            for change in self.run_changes:
                if "joined_at" in change:
                    db["runs"].upsert(change, pk="run_id")
                else:
                    db.execute(
                        "UPDATE runs SET left_at = ? WHERE run_id = ?",
                        [change["left_at"], change["run_id"]],
                    )
            _insert(db, "steps", self.steps)
            if self.epochs:
                db["epochs"].upsert_all(self.epochs.values(), pk=("run_id", "epoch"))
            _insert(db, "peers", self.peers)
            _insert(db, "events", self.events)
            if self.event_updates:
                db.conn.executemany("UPDATE events SET count = :count, last_ts = :last_ts, message = :message, data = :data "
                                    "WHERE ts = :ts AND kind = :kind", list(self.event_updates.values()))
            if self.settings:
                db["settings"].upsert_all(self.rows("settings"), pk="key")

    def clear(self) -> None:
        """Forget every buffered row."""
        for buffer in (self.steps, self.peers, self.events, self.epochs, self.event_updates, self.run_changes, self.settings):
            buffer.clear()


def _insert(db: sqlite_utils.Database, table: str, rows: deque[dict]) -> None:
    """Insert rows that all have the first row's keys, in one prepared statement
    (sqlite-utils' insert_all re-inspects every value: 10x the time of this)."""
    if not rows:
        return
    columns = list(rows[0])
    names = ", ".join(columns)
    placeholders = ", ".join(f":{column}" for column in columns)
    db.conn.executemany(f"INSERT INTO {table} ({names}) VALUES ({placeholders})", rows)
