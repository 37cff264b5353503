"""The control server: newline-delimited JSON requests on a Unix socket.

Each connection is served by its own asyncio task, so a client that connects
and sends nothing blocks no one. A line that is not JSON, not a request
object, longer than ``MAX_LINE_BYTES`` or names an unknown method gets an
error reply and the connection stays usable. ``subscribe`` turns the
connection into a stream of pushed events (see ``Broadcaster``).
"""

from __future__ import annotations

import asyncio
import grp
import json
import logging
import os
from pathlib import Path
from typing import Any, Awaitable, Callable

from p2ptrain import protocol
from p2ptrain.control_types import Push
from p2ptrain.protocol import MAX_LINE_BYTES, encode, error_reply

log = logging.getLogger(__name__)

Handler = Callable[[dict], Awaitable[Any]]
READ_CHUNK = 64 * 1024
SUBSCRIBER_QUEUE = 1000


class RequestError(Exception):
    """Raised by a handler to reply with an error instead of a result.

    Args:
        code: a protocol error code (``protocol.BAD_REQUEST`` ...).
        message: what happened, one line.
        fix: what the user can do, one line.
    """

    def __init__(self, code: str, message: str, fix: str = ""):
        super().__init__(message)
        self.code, self.message, self.fix = code, message, fix


class Broadcaster:
    """Fans pushed events out to every subscribed connection.

    Args:
        snapshot: returns the full state sent first to a new subscriber (the status, as a dict).
    """

    def __init__(self, snapshot: Callable[[], dict]):
        self._snapshot = snapshot
        self._queues: set[asyncio.Queue] = set()

    def publish(self, event: str, data: Any) -> None:
        message = encode({"event": event, "data": data})
        for queue in list(self._queues):
            if queue.qsize() >= SUBSCRIBER_QUEUE:
                # A subscriber that does not read is dropped rather than let it grow the daemon's memory.
                self._queues.discard(queue)
                queue.put_nowait(None)
            else:
                queue.put_nowait(message)

    async def stream(self, writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue = asyncio.Queue(SUBSCRIBER_QUEUE + 1)
        self._queues.add(queue)
        try:
            writer.write(encode({"event": Push.SNAPSHOT, "data": self._snapshot()}))
            await writer.drain()
            while (message := await queue.get()) is not None:
                writer.write(message)
                await writer.drain()
        finally:
            self._queues.discard(queue)

    @property
    def subscribers(self) -> int:
        return len(self._queues)


class ControlServer:
    """Serves the control protocol on a Unix socket.

    Args:
        socket_path: where to listen; a stale socket file there is replaced.
        handlers: method name -> coroutine taking the params dict and returning the result.
        broadcaster: serves ``subscribe``.
        group: a group that may use the socket (mode 0660, the system service), or None (mode 0600).
    """

    def __init__(self, socket_path: Path, handlers: dict[str, Handler], broadcaster: Broadcaster, group: str | None = None):
        self.socket_path = socket_path
        self.handlers = handlers
        self.broadcaster = broadcaster
        self.group = group
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task] = set()

    async def start(self) -> None:
        self.socket_path.unlink(missing_ok=True)
        old_umask = os.umask(0o177 if self.group is None else 0o117)
        try:
            self._server = await asyncio.start_unix_server(self._serve, path=str(self.socket_path), limit=READ_CHUNK)
        finally:
            os.umask(old_umask)
        if self.group is None:
            os.chmod(self.socket_path, 0o600)
        else:
            os.chown(self.socket_path, -1, grp.getgrnam(self.group).gr_gid)
            os.chmod(self.socket_path, 0o660)
        log.info("control socket listening on %s", self.socket_path)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        self.socket_path.unlink(missing_ok=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._connections.add(task)
        try:
            async for line in _lines(reader):
                if line is None:
                    reply = error_reply(
                        None, protocol.TOO_LARGE, f"request line longer than {MAX_LINE_BYTES} bytes", "send one JSON object per line, under 1 MiB"
                    )
                    writer.write(encode(reply))
                    await writer.drain()
                    continue
                request, reply = self._parse(line)
                if reply is None and request["method"] == "subscribe":
                    await self.broadcaster.stream(writer)
                    return
                if reply is None:
                    reply = await self._dispatch(request)
                writer.write(encode(reply))
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        except Exception:
            log.exception("control connection failed")
        finally:
            self._connections.discard(task)
            writer.close()

    def _parse(self, line: bytes) -> tuple[dict, dict | None]:
        """The request, or an error reply for a line that is not a well-formed request."""
        try:
            request = json.loads(line)
        # ValueError covers undecodable bytes and integers too long to convert; RecursionError, nesting too deep.
        except (ValueError, RecursionError) as error:
            return {}, error_reply(None, protocol.BAD_REQUEST, f"not a JSON line: {error}", 'send e.g. {"id": 1, "method": "status", "params": {}}')
        if not isinstance(request, dict):
            return {}, error_reply(None, protocol.BAD_REQUEST, "a request must be a JSON object", 'send e.g. {"id": 1, "method": "status"}')
        request_id = request.get("id")
        method = request.get("method")
        params = request.get("params", {})
        if params is None:
            params = {}
        if not isinstance(method, str):
            return request, error_reply(request_id, protocol.BAD_REQUEST, "'method' must be a string", f"use one of: {', '.join(protocol.METHODS)}")
        if not isinstance(params, dict):
            return request, error_reply(request_id, protocol.BAD_REQUEST, f"'params' must be an object, not {type(params).__name__}", 'send "params": {} or leave it out')
        spoken = request.get("protocol", protocol.PROTOCOL_VERSION)
        if spoken != protocol.PROTOCOL_VERSION:
            return request, error_reply(
                request_id,
                protocol.PROTOCOL_MISMATCH,
                f"this daemon speaks control protocol {protocol.PROTOCOL_VERSION} and the client speaks {spoken!r}",
                "use the p2ptrain the daemon was started from, or restart the daemon so that it runs the one installed now",
            )
        if method not in self.handlers and method != "subscribe":
            return request, error_reply(request_id, protocol.UNKNOWN_METHOD, f"unknown method {method!r}", f"use one of: {', '.join(protocol.METHODS)}")
        request["params"] = params
        return request, None

    async def _dispatch(self, request: dict) -> dict:
        request_id = request.get("id")
        try:
            result = await self.handlers[request["method"]](request["params"])
        except RequestError as error:
            return error_reply(request_id, error.code, error.message, error.fix)
        except Exception as error:
            log.exception("method %s failed", request["method"])
            return error_reply(request_id, protocol.INTERNAL, f"{request['method']} failed: {error}", "see the daemon's log")
        return {"id": request_id, "protocol": protocol.PROTOCOL_VERSION, "result": result}


async def _lines(reader: asyncio.StreamReader):
    """Yield each complete line (without its newline), or None for a line over the limit, until EOF."""
    buffer = bytearray()
    discarding = False
    while chunk := await reader.read(READ_CHUNK):
        buffer += chunk
        while (end := buffer.find(b"\n")) >= 0:
            line = bytes(buffer[:end])
            del buffer[: end + 1]
            if discarding:
                discarding = False
                yield None
            elif len(line) > MAX_LINE_BYTES:
                yield None
            elif line.strip():
                yield line
        if len(buffer) > MAX_LINE_BYTES:
            # Drop the oversized line as it streams in; the error goes out once its newline arrives.
            buffer.clear()
            discarding = True
    if discarding:
        yield None
    elif buffer.strip():
        yield bytes(buffer)
