"""The small HTTP server of ``/metrics`` and the monitor's page, over a real socket; and ``[metrics] listen``."""

from __future__ import annotations

import asyncio
import socket
import urllib.error
import urllib.request

import pytest

from p2ptrain.config import Config, ConfigError, with_value
from p2ptrain.http_endpoint import ListenError, Response, bound_address, parse_listen, start_endpoint


@pytest.mark.parametrize(("text", "expected"), [("127.0.0.1:9464", ("127.0.0.1", 9464)), ("[::1]:80", ("::1", 80)),
                                                ("localhost:0", ("localhost", 0))])
def test_listen_addresses_are_host_and_port(text, expected):
    assert parse_listen(text) == expected


@pytest.mark.parametrize("text", ["9464", "127.0.0.1", "127.0.0.1:99999", "http://127.0.0.1:9464", "::1:9464"])
def test_a_listen_address_that_is_not_host_port_says_what_to_write(text):
    with pytest.raises(ListenError, match=r"is not HOST:PORT \(e\.g\. 127\.0\.0\.1:9464\)"):
        parse_listen(text)


def fetch(url: str, method: str = "GET") -> tuple[int, str, bytes]:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.headers["Content-Type"], answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read()


def test_routes_are_answered_and_other_paths_and_methods_refused():
    calls = []

    async def asynchronous() -> Response:
        calls.append("async")
        return Response(b"# EOF\n", "application/openmetrics-text")

    def failing() -> Response:
        raise RuntimeError("boom")

    async def scenario():
        server = await start_endpoint("127.0.0.1:0", {"/metrics": asynchronous, "/plain": lambda: Response(b"hi", "text/plain"),
                                                      "/broken": failing})
        base = f"http://{bound_address(server)}"
        try:
            return await asyncio.gather(*(asyncio.to_thread(fetch, base + path, method) for path, method in [
                ("/metrics?x=1", "GET"), ("/plain", "GET"), ("/plain", "HEAD"), ("/nothing", "GET"), ("/plain", "POST"),
                ("/broken", "GET")]))
        finally:
            server.close()

    metrics, plain, head, missing, post, broken = asyncio.run(scenario())
    assert metrics == (200, "application/openmetrics-text", b"# EOF\n") and calls == ["async"]
    assert plain == (200, "text/plain", b"hi") and head == (200, "text/plain", b"")
    assert missing[0] == 404 and b"try /broken, /metrics, /plain" in missing[2]
    assert post[0] == 405 and broken[0] == 500


def test_a_taken_port_is_one_line():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(ListenError, match=f"cannot listen on 127.0.0.1:{port}: the port is taken by another program"):
            asyncio.run(start_endpoint(f"127.0.0.1:{port}", {}))


def test_metrics_listen_is_off_by_default_and_checked_when_set():
    assert Config().metrics.listen is None
    assert with_value(Config(), "metrics.listen", "0.0.0.0:9464").metrics.listen == "0.0.0.0:9464"
    assert with_value(Config(), "metrics.listen", "").metrics.listen is None
    with pytest.raises(ConfigError, match=r"metrics.listen = 9464: '9464' is not HOST:PORT \(e.g. 127.0.0.1:9464\)"):
        with_value(Config(), "metrics.listen", "9464")
