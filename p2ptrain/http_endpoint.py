"""A small read-only HTTP server on asyncio, standard library only: ``/metrics`` and the run monitor's page.

Both users run an asyncio loop already (the daemon's, the monitor's), and
serve a handful of fixed paths to ``GET`` (and ``HEAD``); a route is called on
that loop, so it may read the caller's state without locks. Each answer closes
its connection: scrapers and a page that polls every few seconds need nothing
more, and no connection outlives a request.
"""

from __future__ import annotations

import asyncio
import errno
import inspect
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from urllib.parse import urlsplit

logger = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 16 * 1024
REQUEST_TIMEOUT_S = 10.0
_LISTEN = re.compile(r"^(?:\[(?P<ipv6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9.-]+)):(?P<port>\d{1,5})$")


@dataclass
class Response:
    """What a route answers: the body and its content type, status 200 unless said otherwise."""

    body: bytes
    content_type: str
    status: HTTPStatus = HTTPStatus.OK


Route = Callable[[], Response | Awaitable[Response]]


class ListenError(Exception):
    """The server cannot listen where it was told; ``str()`` says why in one line, without the fix
    (the caller knows whether that is ``--listen`` or a config key)."""


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``127.0.0.1:9464``, ``[::1]:9464``, ``0.0.0.0:9464``) as (host, port).

    Port 0 picks a free port (tests); :func:`bound_address` says which.

    Raises:
        ListenError: not HOST:PORT, or the port is above 65535.
    """
    match = _LISTEN.match(text.strip())
    if not match or int(match.group("port")) > 65535:
        raise ListenError(f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:9464)")
    return match.group("ipv6") or match.group("host"), int(match.group("port"))


async def start_endpoint(listen: str, routes: dict[str, Route]) -> asyncio.Server:
    """Listen on ``listen`` (``HOST:PORT``) and answer ``GET`` of each path in ``routes``.

    Args:
        listen: where to listen; see :func:`parse_listen`.
        routes: path (``/metrics``) -> a function, or coroutine function,
            that returns the :class:`Response`; called on this loop, once per request.

    Raises:
        ListenError: a bad address, a taken port, or one this user may not take.
    """
    host, port = parse_listen(listen)
    try:
        return await asyncio.start_server(lambda reader, writer: _answer(reader, writer, routes), host, port,
                                          limit=MAX_REQUEST_BYTES, reuse_address=True)
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            raise ListenError(f"cannot listen on {listen}: the port is taken by another program") from None
        if error.errno == errno.EACCES:
            raise ListenError(f"cannot listen on {listen}: ports below 1024 need root") from None
        raise ListenError(f"cannot listen on {listen}: {error.strerror or error}") from None


def bound_address(server: asyncio.Server) -> str:
    """``HOST:PORT`` the server really listens on (the port it got for port 0)."""
    host, port = server.sockets[0].getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, routes: dict[str, Route]) -> None:
    try:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT_S)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            return
        method, _, rest = head.split(b"\r\n", 1)[0].decode("latin-1").partition(" ")
        path = urlsplit(rest.rpartition(" ")[0] or rest).path
        response = await _response(method, path, routes)
        headers = (
            f"HTTP/1.1 {response.status.value} {response.status.phrase}\r\n"
            f"Content-Type: {response.content_type}\r\n"
            f"Content-Length: {len(response.body)}\r\n"
            "Cache-Control: no-store\r\n"
            "Connection: close\r\n\r\n"
        )
        writer.write(headers.encode("latin-1") + (b"" if method == "HEAD" else response.body))
        await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def _response(method: str, path: str, routes: dict[str, Route]) -> Response:
    if method not in ("GET", "HEAD"):
        return Response(b"only GET\n", "text/plain; charset=utf-8", HTTPStatus.METHOD_NOT_ALLOWED)
    route = routes.get(path)
    if route is None:
        listed = ", ".join(sorted(routes))
        return Response(f"no {path} here; try {listed}\n".encode(), "text/plain; charset=utf-8", HTTPStatus.NOT_FOUND)
    try:
        response = route()
        return await response if inspect.isawaitable(response) else response
    except Exception:
        logger.exception("answering GET %s failed", path)
        return Response(b"internal error; see the log\n", "text/plain; charset=utf-8", HTTPStatus.INTERNAL_SERVER_ERROR)
