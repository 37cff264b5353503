"""The TUI's one link to the daemon's data: its history once, then what it pushes.

``DaemonFeed.run`` (in a thread worker) subscribes to the daemon
(``ControlClient.subscribe``) and posts the first status at once, so the
first frame waits for one round trip only; then it fetches the history the
dashboard shows (peers, steps, epochs, events: four calls, once) and posts it,
and from then on posts each update the daemon pushes as it comes. When the
daemon enters another run it fetches that run's history; when the daemon goes
away it posts ``DaemonUnreachable`` and tries again with back-off, fetching the
history again once it is back. Nothing is polled.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from textual.message import Message

from p2ptrain.control_types import EventsResult, PeersResult, Push, Record, decode_push
from p2ptrain.protocol import ControlClient, DaemonError, DaemonNotRunning
from p2ptrain.tui.daemon_view import MAX_EPOCHS, MAX_EVENTS, MAX_STEPS, History
from p2ptrain.tui.messages import DaemonPushed, DaemonUnreachable, HistoryLoaded

# Seconds between attempts while no daemon answers: quick at first (it may be
# starting), then gentle on a machine where it is simply not running.
RETRY_DELAYS_S = (0.5, 1.0, 2.0, 4.0, 5.0)


def _rows(client: ControlClient, method: str, key: str, result: type[Record] | None = None, **params) -> list:
    """A history method's rows (read as ``result``, a record, when the protocol types it); an older or busy
    daemon that lacks the method yields none. A malformed reply raises ``MalformedReply``."""
    try:
        reply = client.call(method, **{name: value for name, value in params.items() if value is not None})
    except DaemonError as error:
        if error.code == "permission-denied":
            raise
        return []
    if result is not None:
        return getattr(result.from_dict(reply, f"the daemon's {method} reply"), key)
    return reply[key]


def fetch_history(client: ControlClient, run_id: str | None) -> History:
    """What the daemon recorded of run ``run_id`` (peers, steps, epochs) and its latest events.

    Args:
        client: the daemon's control client.
        run_id: the run the daemon is in; None when it is in none (then the
            steps of every run and no peers, as the daemon's methods give them).
    """
    return History(
        run_id=run_id,
        peers=_rows(client, "peers", "peers", PeersResult) if run_id else [],
        steps=_rows(client, "metrics", "steps", run_id=run_id, limit=MAX_STEPS),
        epochs=_rows(client, "epochs", "epochs", run_id=run_id, limit=MAX_EPOCHS),
        events=_rows(client, "events", "events", EventsResult, limit=MAX_EVENTS),
    )


class DaemonFeed:
    """Follows one daemon and posts what it learns as messages.

    Args:
        socket_path: the daemon's control socket.
        post: called (from the feed's thread) with each message for the app,
            e.g. ``App.post_message``.
        timeout: seconds to wait for the daemon to answer a request (and the
            subscription's first message).
        retry_delays_s: seconds between attempts while no daemon answers, one
            per consecutive failure; the last one repeats.
    """

    def __init__(
        self,
        socket_path: str | os.PathLike,
        post: Callable[[Message], object],
        timeout: float = 3.0,
        retry_delays_s: tuple[float, ...] = RETRY_DELAYS_S,
    ) -> None:
        self._client = ControlClient(str(socket_path), timeout=timeout)
        self._post = post
        self._retry_delays_s = retry_delays_s
        self._failures = 0
        self._stopped = threading.Event()
        self._retry_now = threading.Event()

    def run(self) -> None:
        """Follow the daemon until ``stop``; blocks, so run it in a thread."""
        while not self._stopped.is_set():
            delay = self._retry_delays_s[min(self._failures, len(self._retry_delays_s) - 1)]
            try:
                self._follow()
                reason = "the daemon closed the connection"
            except DaemonNotRunning:
                reason = "nothing listens on the control socket"
            except DaemonError as error:
                delay = self._retry_delays_s[-1]
                reason = error.one_line()
            except (OSError, ValueError) as error:
                # A timeout, a reset connection, a garbled line or a reply that is not what the protocol
                # says (``MalformedReply``): the daemon is there but unwell, or another version.
                reason = f"the daemon did not answer properly: {error}"
            if self._stopped.is_set():
                return
            self._failures += 1
            self._post(DaemonUnreachable(reason, delay))
            self._retry_now.wait(delay)
            self._retry_now.clear()

    def _follow(self) -> None:
        """One subscription, from the snapshot until the daemon hangs up (or ``stop``)."""
        run_id: object = None
        for message in self._client.subscribe():
            if self._stopped.is_set():
                return  # stopped while the subscription was being opened, before close() could reach it
            event, data = message["event"], decode_push(message["event"], message.get("data"))
            self._post(DaemonPushed(event, data))
            if event == Push.SNAPSHOT:
                self._failures = 0
            if event == Push.SNAPSHOT or (event == Push.STATUS and data.run_id != run_id):
                run_id = data.run_id
                self._post(HistoryLoaded(fetch_history(self._client, run_id)))

    def retry_now(self) -> None:
        """Try to reach the daemon at once instead of after the current back-off (it was just started)."""
        self._retry_now.set()

    def stop(self) -> None:
        """End ``run`` soon, from any thread: the subscription is closed, the back-off cut short."""
        self._stopped.set()
        self._client.close()
        self._retry_now.set()
