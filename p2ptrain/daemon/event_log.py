"""What happened, recorded once for everyone: the daemon log, the ``events`` table and the subscribers."""

from __future__ import annotations

import logging
import time

from p2ptrain.daemon.server import Broadcaster
from p2ptrain.storage.database import Database

log = logging.getLogger(__name__)


class EventLog:
    """Records events (joins, pauses, crashes, checkpoints...).

    Args:
        db: the database; the event goes to its ``events`` table.
        broadcaster: subscribers get it as an ``event`` push.
    """

    def __init__(self, db: Database, broadcaster: Broadcaster):
        self.db, self.broadcaster = db, broadcaster

    def record(self, kind: str, message: str, data: dict | None = None) -> None:
        """Record one event: ``kind`` a short word (``joined``, ``worker-oom``), ``message`` one line for people."""
        ts = time.time()
        log.info("%s: %s", kind, message)
        self.db.record_event(kind, message, data, ts=ts)
        self.broadcaster.publish("event", {"ts": ts, "kind": kind, "message": message, "data": data})
