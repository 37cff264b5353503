"""One poll of the daemon: its status, the swarm's peers and the history so far.

The history (steps, epochs, events) lives in the daemon's SQLite database; the
TUI reads it through the ``metrics``, ``epochs`` and ``events`` methods, first
in full (bounded), then only what is newer, so a freshly started TUI shows the
past and a long-running one does not re-read it every second.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from p2ptrain.protocol import ControlClient, DaemonError

MAX_STEPS = 2000
MAX_EPOCHS = 200
MAX_EVENTS = 300


@dataclass(frozen=True)
class DaemonSnapshot:
    """What the dashboard shows, as of one poll.

    Args:
        status: the daemon's ``status`` result (DESIGN's status object).
        peers: PeerRow dicts of the current run (empty when idle).
        steps: rows of the ``steps`` table, oldest first.
        epochs: rows of the ``epochs`` table, oldest first.
        events: rows of the ``events`` table, oldest first.
    """

    status: dict
    peers: tuple = ()
    steps: tuple = ()
    epochs: tuple = ()
    events: tuple = ()

    @property
    def run_id(self) -> str | None:
        run = self.status.get("run") or {}
        return run.get("id")


@dataclass
class History:
    """The rows fetched so far, and where the next incremental fetch starts."""

    run_id: str | None = None
    steps: deque = field(default_factory=lambda: deque(maxlen=MAX_STEPS))
    epochs: list = field(default_factory=list)
    events: deque = field(default_factory=lambda: deque(maxlen=MAX_EVENTS))

    def reset_run(self, run_id: str | None) -> None:
        """Forget the step and epoch rows of another run."""
        self.run_id = run_id
        self.steps.clear()
        self.epochs.clear()


def _newer(rows: list[dict], last: dict | None) -> list[dict]:
    # `since` may be inclusive on the daemon's side: keep only strictly newer rows.
    if last is None:
        return rows
    return [row for row in rows if (row.get("ts") or 0) > (last.get("ts") or 0)]


def _optional(client: ControlClient, method: str, key: str, **params) -> list[dict]:
    """A history method's rows; an older or busy daemon that lacks it yields none."""
    try:
        return client.call(method, **{name: value for name, value in params.items() if value is not None})[key]
    except DaemonError as error:
        if error.code == "permission-denied":
            raise
        return []


def fetch_snapshot(client: ControlClient, history: History, with_history: bool = True) -> DaemonSnapshot:
    """Ask the daemon for everything the dashboard shows, updating ``history``.

    Args:
        client: the daemon's control client.
        history: the rows fetched so far; new ones are added to it.
        with_history: False asks only for the status and peers (two round
            trips instead of five) and returns the history as it was.

    Raises DaemonNotRunning when no daemon listens, DaemonError when it refuses.
    """
    status = client.call("status")
    run_id = (status.get("run") or {}).get("id")
    if run_id and run_id != history.run_id:
        history.reset_run(run_id)
    peers: list[dict] = []
    if run_id:
        peers = _optional(client, "peers", "peers")
    if with_history:
        _fetch_history(client, history)
    return DaemonSnapshot(
        status=status,
        peers=tuple(peers),
        steps=tuple(history.steps),
        epochs=tuple(history.epochs),
        events=tuple(history.events),
    )


def _fetch_history(client: ControlClient, history: History) -> None:
    """Add the steps and events newer than ``history``'s to it, and replace its epochs."""
    last_step = history.steps[-1] if history.steps else None
    steps = _optional(
        client, "metrics", "steps", run_id=history.run_id, since=last_step and last_step.get("ts"), limit=MAX_STEPS
    )
    history.steps.extend(_newer(steps, last_step))
    history.epochs[:] = _optional(client, "epochs", "epochs", run_id=history.run_id, limit=MAX_EPOCHS)
    last_event = history.events[-1] if history.events else None
    events = _optional(client, "events", "events", since=last_event and last_event.get("ts"), limit=MAX_EVENTS)
    history.events.extend(_newer(events, last_event))
