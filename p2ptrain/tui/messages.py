"""Messages the background workers post to the app."""

from __future__ import annotations

from textual.message import Message

from p2ptrain.tui.snapshot import DaemonSnapshot


class DaemonUpdated(Message):
    """A poll of the daemon succeeded.

    Args:
        snapshot: everything the dashboard shows.
    """

    def __init__(self, snapshot: DaemonSnapshot) -> None:
        super().__init__()
        self.snapshot = snapshot


class DaemonUnreachable(Message):
    """A poll failed: no daemon listens, or it refused.

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
