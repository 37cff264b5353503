"""Repeated events folded into one row: a count and the time span, written every few seconds.

On a real GPU a diverged run skipped ~700 batches as non-finite in 84 s: 700 events, 700
rows, 700 log lines, and the one line that mattered scrolled away. An event that repeats
one still open (same kind, same message) within ``gap_s`` of its last occurrence joins its
row instead: the row keeps the first occurrence's ``ts``, and counts ``count`` occurrences
until ``last_ts`` (the last one's data). The row is written when it opens; its count and
span at most every ``update_interval_s`` while it grows, and once more when it closes
(``gap_s`` without a repeat). A flood is one row, updated a few times a minute.

Pure bookkeeping (stdlib only), driven by ``event_log.EventLog`` with the clock it is given.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from p2ptrain.control_types import EventRow

# a repeat within this many seconds of the last occurrence joins the row
BURST_GAP_S = 30.0
# a growing row is written (database, subscribers) at most this often
UPDATE_INTERVAL_S = 5.0


@dataclasses.dataclass
class Burst:
    """One row of the ``events`` table standing for ``count`` occurrences of one event.

    ts: the first occurrence (the row's identity, with ``kind``); last_ts: the latest.
    data: the latest occurrence's data.
    written_count: the count the database and the subscribers have; written_at: when.
    logged_at: when the log last had a line of it.
    closed: no repeat came within the gap: the row is final.
    """

    kind: str
    message: str
    data: Any
    ts: float
    last_ts: float
    count: int = 1
    written_count: int = 1
    written_at: float = 0.0
    logged_at: float = 0.0
    closed: bool = False

    def row(self) -> EventRow:
        """The row as the ``events`` table and the ``event`` push carry it."""
        return EventRow(ts=self.ts, kind=self.kind, message=self.message, data=self.data, count=self.count,
                        last_ts=self.last_ts)


class EventBursts:
    """Open rows of repeating events, by (kind, message).

    Args:
        gap_s: a repeat joins an open row within this many seconds of its last occurrence.
        update_interval_s: a growing row is due for writing at most this often.
    """

    def __init__(self, gap_s: float = BURST_GAP_S, update_interval_s: float = UPDATE_INTERVAL_S):
        self.gap_s, self.update_interval_s = gap_s, update_interval_s
        self._open: dict[tuple[str, str], Burst] = {}

    def add(self, kind: str, message: str, data: Any, ts: float) -> Burst | None:
        """One occurrence at ``ts``: the new row to record now, or None when it joined an open one."""
        key = (kind, message)
        burst = self._open.get(key)
        if burst is not None and ts - burst.last_ts <= self.gap_s:
            burst.count, burst.last_ts, burst.data = burst.count + 1, ts, data
            return None
        burst = Burst(kind, message, data, ts, ts, written_at=ts, logged_at=ts)
        self._open[key] = burst
        return burst

    def due(self, now: float, final: bool = False) -> list[Burst]:
        """Rows whose count grew since written, and which were last written ``update_interval_s`` ago
        or have closed (``final``: all of them, the daemon stops); each is marked written. Closed
        rows are forgotten."""
        due = []
        for key, burst in list(self._open.items()):
            burst.closed = final or now - burst.last_ts > self.gap_s
            if burst.count > burst.written_count and (burst.closed or now - burst.written_at >= self.update_interval_s):
                burst.written_count, burst.written_at = burst.count, now
                due.append(burst)
            if burst.closed:
                del self._open[key]
        return due
