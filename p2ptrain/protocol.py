"""The control protocol between the daemon and its clients (CLI, TUI).

Newline-delimited JSON over a Unix socket, one object per line, at most
``MAX_LINE_BYTES`` a line. A request is ``{"id": 1, "method": "status",
"params": {}}``; the reply carries the same id and either ``result`` or
``error`` (``{"code", "message", "fix"}``). After ``subscribe`` the daemon
pushes ``{"event": name, "data": ...}`` lines until the client hangs up.
What the results and pushes hold, and the one codec that checks them, is
``control_types.py``.

Both sides name their ``PROTOCOL_VERSION``: a request and a reply carry
``"protocol"``, and each side refuses the other's when it differs, in one
line that says which side to restart or upgrade (a CLI upgraded while the
daemon kept running is the usual case). A request without it (``nc -U``, a
script) is served as the daemon's own version.

Standard library only: the CLI imports this module on every call.
"""

from __future__ import annotations

import json
import socket
# typing costs the CLI several ms to import; the names are only needed by type checkers.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Iterator

PROTOCOL_VERSION = 1
MAX_LINE_BYTES = 1 << 20

# Error codes a reply can carry.
BAD_REQUEST = "bad-request"
TOO_LARGE = "too-large"
UNKNOWN_METHOD = "unknown-method"
INVALID_STATE = "invalid-state"
NOT_AVAILABLE = "not-available"
INTERNAL = "internal"
PROTOCOL_MISMATCH = "protocol-mismatch"

METHODS = (
    "status",
    "peers",
    "metrics",
    "epochs",
    "events",
    "join",
    "pause",
    "resume",
    "finish",
    "leave",
    "unban",
    "config.get",
    "config.set",
    "subscribe",
)


class DaemonError(Exception):
    """The daemon answered with an error.

    Args:
        code: one of the error codes above.
        message: what happened, in one line.
        fix: what the user can do about it, in one line (may be empty).
    """

    def __init__(self, code: str, message: str, fix: str = ""):
        super().__init__(message)
        self.code = code
        self.message = message
        self.fix = fix

    def one_line(self) -> str:
        return f"{self.message} ({self.fix})" if self.fix else self.message


class DaemonNotRunning(Exception):
    """Nothing listens on the control socket."""

    def __init__(self, socket_path: str, reason: str = ""):
        super().__init__(f"no p2ptrain daemon is listening on {socket_path}")
        self.socket_path = socket_path
        self.reason = reason

    def one_line(self, start_command: str = "p2ptrain daemon") -> str:
        return f"p2ptrain daemon is not running (no one listens on {self.socket_path}); start it with: {start_command}"


def encode(message: dict) -> bytes:
    """One protocol line: compact JSON and a newline."""
    return json.dumps(message, separators=(",", ":"), default=str).encode() + b"\n"


def error_reply(request_id: Any, code: str, message: str, fix: str = "") -> dict:
    return {"id": request_id, "protocol": PROTOCOL_VERSION, "error": {"code": code, "message": message, "fix": fix}}


def check_daemon_protocol(version: Any) -> None:
    """Raise DaemonError (``protocol-mismatch``) when the daemon's protocol ``version`` is not this client's.

    ``None`` (a daemon from before replies carried it) is version 1.
    """
    version = 1 if version is None else version
    if version != PROTOCOL_VERSION:
        raise DaemonError(
            PROTOCOL_MISMATCH,
            f"the daemon speaks control protocol {version} and this p2ptrain speaks {PROTOCOL_VERSION}",
            "restart the daemon so that it runs the p2ptrain installed now (systemctl restart p2ptrain, "
            "or stop it and run p2ptrain daemon), or use the p2ptrain it was started from",
        )


class ControlClient:
    """A blocking client of the control socket.

    Args:
        socket_path: path of the daemon's control socket.
        timeout: seconds to wait for connecting and for each reply.
    """

    def __init__(self, socket_path: str, timeout: float = 5.0):
        self.socket_path = str(socket_path)
        self.timeout = timeout
        self._next_id = 0
        self._subscription: socket.socket | None = None

    def _connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError) as error:
            sock.close()
            raise DaemonNotRunning(self.socket_path, str(error)) from None
        except PermissionError:
            sock.close()
            raise DaemonError(
                "permission-denied",
                f"not allowed to open {self.socket_path}",
                "run as the daemon's user, or join the group 'p2ptrain' (sudo usermod -aG p2ptrain $USER)",
            ) from None
        return sock

    def _request(self, method: str, params: dict | None) -> tuple[socket.socket, bytes]:
        self._next_id += 1
        request = {"id": self._next_id, "protocol": PROTOCOL_VERSION, "method": method, "params": params or {}}
        return self._connect(), encode(request)

    def call(self, method: str, **params: Any) -> dict:
        """Send one request and return its ``result``; raise DaemonError on an error reply."""
        sock, line = self._request(method, params)
        with sock:
            sock.sendall(line)
            reader = sock.makefile("rb")
            raw = reader.readline(MAX_LINE_BYTES * 8)
        if not raw:
            raise DaemonError(INTERNAL, "the daemon closed the connection without answering", "see its log")
        reply = json.loads(raw)
        if "error" in reply:
            error = reply["error"]
            raise DaemonError(error.get("code", INTERNAL), error.get("message", ""), error.get("fix", ""))
        check_daemon_protocol(reply.get("protocol"))
        return reply["result"]

    def subscribe(self, timeout: float | None = None) -> Iterator[dict]:
        """Yield pushed ``{"event", "data"}`` messages: a snapshot first, then changes.

        The snapshot must come within the client's ``timeout``; ``close`` (from
        any thread) ends the iteration.

        Args:
            timeout: seconds to wait for each message after the snapshot (None waits forever).
        """
        sock, line = self._request("subscribe", {})
        self._subscription = sock
        try:
            with sock:
                sock.sendall(line)
                reader = sock.makefile("rb")
                while True:
                    raw = reader.readline(MAX_LINE_BYTES * 8)
                    sock.settimeout(timeout)
                    if not raw:
                        return
                    message = json.loads(raw)
                    if "error" in message:
                        error = message["error"]
                        raise DaemonError(error.get("code", INTERNAL), error.get("message", ""), error.get("fix", ""))
                    if message.get("event") == "snapshot" and isinstance(message.get("data"), dict):
                        check_daemon_protocol(message["data"].get("protocol"))
                    if "event" in message:
                        yield message
        finally:
            self._subscription = None

    def close(self) -> None:
        """End the subscription being read, from any thread: its iterator stops as if the daemon hung up."""
        sock = self._subscription
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed
