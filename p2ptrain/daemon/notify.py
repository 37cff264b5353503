"""Tell systemd how the daemon is doing (sd_notify), with the standard library only.

Under ``Type=notify`` systemd passes a datagram socket in ``NOTIFY_SOCKET``
and, with ``WatchdogSec=``, the watchdog period in ``WATCHDOG_USEC``. The
daemon sends ``READY=1`` once its control socket accepts connections,
``WATCHDOG=1`` at half the period, a one-line ``STATUS=`` whenever its state
changes (shown by ``systemctl status``), and ``STOPPING=1`` when it shuts
down. Outside systemd every call is a no-op, so the daemon calls them
unconditionally.

The wire format is the one of sd_notify(3): one datagram of
newline-separated ``KEY=value`` lines per message.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

logger = logging.getLogger(__name__)


class SystemdNotifier:
    """Sends sd_notify messages to the socket systemd gave us; never raises.

    Args:
        socket_address: the ``NOTIFY_SOCKET`` value: a file system path, or an
            abstract socket name starting with ``@``. ``None`` makes every
            call a no-op (not started by systemd, or not ``Type=notify``).
        watchdog_usec: the ``WATCHDOG_USEC`` value, the period within which
            systemd expects ``WATCHDOG=1``; ``None`` when no watchdog is set.
        watchdog_pid: the ``WATCHDOG_PID`` value: the process the watchdog
            is meant for; another process (a child that inherited the
            environment) must not ping.
    """

    def __init__(
        self,
        socket_address: str | None,
        watchdog_usec: int | None = None,
        watchdog_pid: int | None = None,
    ) -> None:
        self.socket_address = socket_address or None
        self.watchdog_usec = watchdog_usec
        self.watchdog_pid = watchdog_pid
        # Logged at warning level once; repeated failures (the watchdog pings
        # every 30 s) would otherwise flood the log until one succeeds.
        self._failing = False

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> SystemdNotifier:
        """A notifier for the sockets and watchdog systemd set in the environment.

        Args:
            environ: the environment to read (default ``os.environ``).
                Malformed ``WATCHDOG_USEC`` / ``WATCHDOG_PID`` values are
                logged and ignored, as sd_watchdog_enabled(3) does.
        """
        environ = os.environ if environ is None else environ
        return cls(
            socket_address=environ.get("NOTIFY_SOCKET") or None,
            watchdog_usec=_positive_int(environ, "WATCHDOG_USEC"),
            watchdog_pid=_positive_int(environ, "WATCHDOG_PID"),
        )

    @property
    def enabled(self) -> bool:
        """Whether messages go anywhere (``NOTIFY_SOCKET`` was set)."""
        return self.socket_address is not None

    def ready(self, status: str = "") -> None:
        """Tell systemd that start-up finished (``systemctl start`` returns now)."""
        self._send({"READY": "1", "STATUS": status})

    def status(self, text: str) -> None:
        """Set the one-line status ``systemctl status p2ptrain`` shows."""
        self._send({"STATUS": text})

    def watchdog(self) -> None:
        """Tell systemd the daemon is alive; due at least every ``WATCHDOG_USEC``."""
        self._send({"WATCHDOG": "1"})

    def stopping(self, status: str = "") -> None:
        """Tell systemd the daemon is shutting down (checkpointing, leaving the swarm)."""
        self._send({"STOPPING": "1", "STATUS": status})

    def watchdog_interval_s(self) -> float | None:
        """How often to call :meth:`watchdog`: half the watchdog period, in seconds.

        ``None`` when systemd set no watchdog, or set it for another process
        (``WATCHDOG_PID`` is not ours).
        """
        if not self.watchdog_usec:
            return None
        if self.watchdog_pid is not None and self.watchdog_pid != os.getpid():
            return None
        return self.watchdog_usec / 1_000_000 / 2

    def _send(self, fields: dict[str, str]) -> None:
        if self.socket_address is None:
            return
        # A newline inside a value would start a new KEY=value line.
        message = "\n".join(f"{key}={' '.join(value.splitlines())}" for key, value in fields.items() if value)
        if not message:
            return
        address = self.socket_address
        if address.startswith("@"):
            address = "\0" + address[1:]
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto(message.encode("utf-8"), address)
        except OSError as error:
            log = logger.debug if self._failing else logger.warning
            log("cannot notify systemd at %s: %s", self.socket_address, error)
            self._failing = True
        else:
            self._failing = False


def _positive_int(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name)
    if not value:
        return None
    try:
        number = int(value)
    except ValueError:
        logger.warning("ignoring %s=%r: not an integer", name, value)
        return None
    if number <= 0:
        logger.warning("ignoring %s=%r: not positive", name, value)
        return None
    return number
