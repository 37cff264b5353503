"""The daemon's commands to a training worker, read from the pipe as they arrive.

The training loop runs commands between steps, but a step can wait for an
averaging round: up to the averaging timeout (120 s on the internet) when the
round finds no group, e.g. because the other peers paused or left. A ``pause``
or ``leave`` sent meanwhile waited as long (the NAT lab's last peer to leave:
120 s inside its step). So a thread reads the pipe all the time, keeps the
commands for the loop, and tells the worker at once what arrived
(``on_arrival``, on the reader thread): for a pause or leave the worker lets
go of the rounds that have not found a group, and the step ends as after a
round without one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from p2ptrain.worker_pipe import Command, MalformedMessage, decode_command

logger = logging.getLogger(__name__)


class CommandInbox:
    """Commands received from the daemon, waiting for the training loop.

    Args:
        conn: the worker's end of the pipe (only this inbox reads it once started).
        on_arrival: called on the reader thread with each command as it arrives.
        on_unknown: called on the reader thread with what arrived when it is no command
            this worker knows (its ``repr``), so the worker can answer with an error.
        kept: commands received before the inbox started (while waiting for the plan), first in line.
    """

    def __init__(self, conn, on_arrival: Callable[[Command], None], on_unknown: Callable[[str], None],
                 kept: list[Command] | None = None):
        self.conn = conn
        self.on_arrival, self.on_unknown = on_arrival, on_unknown
        self._waiting: list[Command] = list(kept or [])
        self._changed = threading.Condition()
        self.closed = False  # the daemon closed the pipe
        self._reader = threading.Thread(target=self._read_forever, name="command-reader", daemon=True)

    def start(self) -> None:
        self._reader.start()

    def take(self) -> list[Command]:
        """The commands waiting, oldest first; they are the caller's to run."""
        with self._changed:
            waiting, self._waiting = self._waiting, []
            return waiting

    def wait(self, timeout: float) -> None:
        """Return after ``timeout`` seconds, or sooner when a command is waiting or the pipe closed."""
        with self._changed:
            self._changed.wait_for(lambda: self._waiting or self.closed, timeout)

    def _read_forever(self) -> None:
        while True:
            try:
                received = self.conn.recv()
            except (EOFError, OSError):
                logger.warning("The daemon closed the pipe: stopping")
                with self._changed:
                    self.closed = True
                    self._changed.notify_all()
                return
            except Exception as error:  # a message that does not even unpickle: read on
                logger.warning("Ignoring an unreadable command: %r", error)
                self.on_unknown(f"<unreadable: {error!r}>")
                continue
            try:
                command = decode_command(received)
            except MalformedMessage as error:
                logger.warning("Ignoring a command: %s", error)
                self.on_unknown(repr(received))
                continue
            try:
                self.on_arrival(command)
            except Exception:
                logger.exception("Could not act on the arrival of %s; the loop runs it between steps", type(command).__name__)
            with self._changed:
                self._waiting.append(command)
                self._changed.notify_all()
