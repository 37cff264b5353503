"""What the dashboard knows of the daemon: its status, the run's peers, and the history so far.

Filled once from the history the feed fetches (``History``), then kept up to
date by each update the daemon pushes (``DaemonView.apply``). Lives in the
app's thread; the feed's thread only fetches and forwards.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from p2ptrain.control_types import EventRow, PeerRow, PeersUpdate, Push, Status

# Enough for the charts and the log of the widest terminal.
MAX_STEPS = 2000
MAX_EPOCHS = 200
MAX_EVENTS = 300

# The parts of the dashboard an update can change; the app redraws only those.
STATUS, PEERS, STEPS, EPOCHS, EVENTS = "status", "peers", "steps", "epochs", "events"
EVERYTHING = frozenset({STATUS, PEERS, STEPS, EPOCHS, EVENTS})


@dataclass
class History:
    """What the daemon had recorded when the TUI (re)connected or the run changed.

    Args:
        run_id: the run the peers, steps and epochs belong to (None: not in a run).
        peers: the run's peers.
        steps: rows of the ``steps`` table, oldest first.
        epochs: rows of the ``epochs`` table, oldest first.
        events: rows of the ``events`` table, oldest first.
    """

    run_id: str | None = None
    peers: list[PeerRow] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)
    epochs: list[dict] = field(default_factory=list)
    events: list[EventRow] = field(default_factory=list)


class DaemonView:
    """The daemon as the dashboard shows it.

    Args:
        status: the daemon's status, e.g. the snapshot a subscription starts with.
    """

    def __init__(self, status: Status) -> None:
        self.status = status
        self.peers: tuple[PeerRow, ...] = ()
        self.steps: deque[dict] = deque(maxlen=MAX_STEPS)
        self.epochs: list[dict] = []
        self.events: deque[EventRow] = deque(maxlen=MAX_EVENTS)
        # What each push changes, with the type its data has (``control_types.decode_push``); pushes not
        # listed (a newer daemon's) are ignored.
        self._handlers = {
            Push.SNAPSHOT: (Status, self._take_status),
            Push.STATUS: (Status, self._take_status),
            Push.PEERS: (PeersUpdate, self._take_peers),
            Push.STEP: (dict, self._add_step),
            Push.EPOCH: (dict, self._add_epoch),
            Push.EVENT: (EventRow, self._add_event),
        }

    @property
    def run_id(self) -> str | None:
        return self.status.run_id

    @property
    def last_averaging(self) -> float | None:
        """When the newest finished epoch ended (its averaging round), or None."""
        ended = [row["ended_at"] for row in self.epochs if row.get("ended_at")]
        return ended[-1] if ended else None

    def load(self, history: History) -> frozenset[str]:
        """Take a freshly fetched history in place of what was there; returns the parts it changed."""
        self.events = deque(history.events, maxlen=MAX_EVENTS)
        if history.run_id != self.run_id:
            return frozenset({EVENTS})  # the daemon changed runs meanwhile: that run's history is on its way
        self.peers = tuple(history.peers)
        self.steps = deque(history.steps, maxlen=MAX_STEPS)
        self.epochs = list(history.epochs[-MAX_EPOCHS:])
        return EVERYTHING

    def apply(self, event: str, data) -> frozenset[str]:
        """Take one pushed update (``{"event", "data"}`` of ``subscribe``, its data decoded by
        ``control_types.decode_push``); returns the parts it changed."""
        kind, handler = self._handlers.get(event, (None, None))
        if handler is None or not isinstance(data, kind):
            return frozenset()
        return handler(data)

    def _take_status(self, status: Status) -> frozenset[str]:
        if status.run_id == self.run_id:
            self.status = status
            return frozenset({STATUS})
        # Another run (or none): its history comes from the feed; the old run's is not shown meanwhile.
        self.status = status
        self.peers = ()
        self.steps.clear()
        self.epochs.clear()
        return frozenset({STATUS, PEERS, STEPS, EPOCHS})

    def _take_peers(self, data: PeersUpdate) -> frozenset[str]:
        if data.run_id != self.run_id:
            return frozenset()
        self.peers = tuple(data.peers)
        return frozenset({PEERS})

    def _add_step(self, step: dict) -> frozenset[str]:
        # A step pushed while the history was being fetched may be in both. Each worker (one per GPU)
        # reports its own steps: one may arrive after another worker's newer one.
        worker = step.get("worker")
        newest = next((row.get("ts") or 0 for row in reversed(self.steps) if row.get("worker") == worker), 0)
        if (step.get("ts") or 0) <= newest:
            return frozenset()
        self.steps.append(step)
        return frozenset({STEPS})

    def _add_epoch(self, epoch: dict) -> frozenset[str]:
        # Each worker reports the epochs it took part in: one row per epoch number.
        self.epochs = [row for row in self.epochs if row.get("epoch") != epoch.get("epoch")]
        self.epochs.append(epoch)
        self.epochs.sort(key=lambda row: row.get("epoch") or 0)
        del self.epochs[:-MAX_EPOCHS]
        return frozenset({EPOCHS})

    def _add_event(self, event: EventRow) -> frozenset[str]:
        # a row of repeats comes again with its new count: the same ts and kind (daemon/event_bursts.py)
        for index, shown in enumerate(self.events):
            if (shown.ts, shown.kind) == (event.ts, event.kind):
                self.events[index] = event
                return frozenset({EVENTS})
        if self.events and event.ts <= self.events[-1].ts:
            return frozenset()
        self.events.append(event)
        return frozenset({EVENTS})
