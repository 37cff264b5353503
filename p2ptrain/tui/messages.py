"""Messages the background workers post to the app."""

from __future__ import annotations

from typing import Any

from textual.message import Message

from p2ptrain.tui.daemon_view import History


class DaemonPushed(Message):
    """The daemon pushed an update (its ``subscribe`` stream).

    Args:
        event: what kind (``control_types.Push``): ``snapshot`` (the status, first on every
            subscription), ``status``, ``step``, ``epoch``, ``event`` or ``peers``.
        data: what the daemon sent with it, as its record (``control_types.decode_push``:
            ``Status``, ``EventRow``, ``PeersUpdate``; a step or epoch row as a dict).
    """

    def __init__(self, event: str, data: Any) -> None:
        super().__init__()
        self.event = event
        self.data = data


class HistoryLoaded(Message):
    """The history was fetched: after a (re)connection, or when the daemon entered another run.

    Args:
        history: the run's peers, steps and epochs, and the latest events.
    """

    def __init__(self, history: History) -> None:
        super().__init__()
        self.history = history


class DaemonUnreachable(Message):
    """The daemon cannot be followed: no daemon listens, it refused, or it went away.

    Args:
        reason: one line saying what happened and how to fix it.
        retry_in_s: seconds until the next attempt.
    """

    def __init__(self, reason: str, retry_in_s: float) -> None:
        super().__init__()
        self.reason = reason
        self.retry_in_s = retry_in_s


class ActionFinished(Message):
    """A control action (join, pause, ...) got its answer.

    Args:
        action: the method that was called.
        outcome: one line for the user.
        failed: True when the daemon refused or was unreachable.
    """

    def __init__(self, action: str, outcome: str, failed: bool) -> None:
        super().__init__()
        self.action = action
        self.outcome = outcome
        self.failed = failed
