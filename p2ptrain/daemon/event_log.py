"""What happened, recorded once for everyone: the daemon log, the ``events`` table and the subscribers.

What the workers report repeats (a skipped batch, an averaging round, a taken port): those
events are folded into one row with a count and a time span (``event_bursts``), written and
pushed at most every few seconds, and logged when the row opens, at most once a minute while
it grows, and when it closes. The daemon's own events (a pause, a join) are one row each.
"""

from __future__ import annotations

import logging
import time

from p2ptrain.daemon.event_bursts import Burst, EventBursts
from p2ptrain.daemon.server import Broadcaster
from p2ptrain.control_types import Push
from p2ptrain.storage.database import Database

log = logging.getLogger(__name__)

# a growing row of repeats gets a log line at most this often
LOG_INTERVAL_S = 60.0


class EventLog:
    """Records events (joins, pauses, crashes, checkpoints...).

    Args:
        db: the database; the event goes to its ``events`` table.
        broadcaster: subscribers get it as an ``event`` push (a row of repeats again, with its new
            count, each time it is written: the same ``ts`` and ``kind``).
    """

    def __init__(self, db: Database, broadcaster: Broadcaster):
        self.db, self.broadcaster = db, broadcaster
        self.bursts = EventBursts()

    def record(self, kind: str, message: str, data: dict | None = None) -> None:
        """Record one event: ``kind`` a short word (``joined``, ``worker-oom``), ``message`` one line for people."""
        self._write(Burst(kind, message, data, time.time(), time.time()))

    def record_repeating(self, kind: str, message: str, data: dict | None = None) -> None:
        """Record an event that may repeat: one that repeats an open row joins it (see the module docstring)."""
        burst = self.bursts.add(kind, message, data, time.time())
        if burst is not None:
            self._write(burst)

    def flush(self, final: bool = False) -> None:
        """Write the rows of repeats that grew (the daemon's tick; ``final``: every one, at stop)."""
        now = time.time()
        for burst in self.bursts.due(now, final):
            self.db.update_event(burst.ts, burst.kind, burst.count, burst.last_ts, burst.message, burst.data)
            self.broadcaster.publish(Push.EVENT, burst.row().to_dict())
            if burst.closed or now - burst.logged_at >= LOG_INTERVAL_S:
                burst.logged_at = now
                log.info("%s: %s%s", burst.kind, burst.message, burst.row().repeated_words())

    def _write(self, burst: Burst) -> None:
        log.info("%s: %s", burst.kind, burst.message)
        self.db.record_event(burst.kind, burst.message, burst.data, ts=burst.ts, count=burst.count, last_ts=burst.last_ts)
        self.broadcaster.publish(Push.EVENT, burst.row().to_dict())
