"""``p2ptrain monitor RUN --peers ADDR [--listen HOST:PORT]``: a web page and ``/metrics`` of a run, for its organisers.

Serves, until Ctrl-C or SIGTERM:

- ``/``: the run's page (``page.html``, from the package: no CDN), which
  reads ``/api/run.json`` every few seconds and draws it;
- ``/api/run.json``: the run, its peers, the epochs seen, and loss and
  throughput over time (``history.RunHistory.to_json``);
- ``/metrics``: the same in the OpenMetrics text format (``run_metrics.py``).

The HTTP server starts first, so a taken port fails at once; the page says
"connecting" until the run's manifest is read. Reads of the DHT run in a
thread every ``--interval`` seconds; the asyncio loop only serves.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.resources
import json
import logging
import signal
import sys
import time
from http import HTTPStatus

from p2ptrain.http_endpoint import ListenError, Response, bound_address, parse_listen, start_endpoint
from p2ptrain.multiaddr import validate_multiaddr
from p2ptrain.openmetrics import CONTENT_TYPE

logger = logging.getLogger("p2ptrain.monitor")

DEFAULT_LISTEN = "127.0.0.1:9465"
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
# Records are republished every 30 s; reading twice as often catches every one.
DEFAULT_INTERVAL_S = 15.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN", help="the run to watch")
    parser.add_argument("--peers", nargs="+", metavar="MULTIADDR", required=True,
                        help="addresses of peers in the run (local.addresses in a peer's p2ptrain status --json)")
    parser.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT",
                        help=f"where to serve the page and /metrics (default {DEFAULT_LISTEN}; 0.0.0.0:PORT for other machines)")
    parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S, metavar="SECONDS",
                        help=f"seconds between reads of the run's records (default {DEFAULT_INTERVAL_S:.0f})")
    parser.add_argument("--host-maddrs", nargs="+", metavar="MULTIADDR", default=["/ip4/0.0.0.0/tcp/0"],
                        help="where the monitor's peer listens (default any interface, a random port)")
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default="warning")


def run(args: argparse.Namespace) -> int:
    """Check the command line, then watch the run and serve until stopped; returns the exit code."""
    from p2ptrain.peers.swarm.manifest import ManifestError, check_run_id

    try:
        check_run_id(args.run)
        peers = [validate_multiaddr(address) for address in args.peers]
        host_maddrs = [validate_multiaddr(address) for address in args.host_maddrs]
        parse_listen(args.listen)
        if not args.interval > 0:
            raise ValueError(f"--interval {args.interval} is not a number of seconds above 0; use e.g. --interval 15")
    except (ValueError, ManifestError, ListenError) as error:
        print(f"p2ptrain monitor: {error}", file=sys.stderr)
        return EXIT_USAGE
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return asyncio.run(Monitor(args.run, peers, host_maddrs, args.listen, args.interval).serve())


class Monitor:
    """The monitor's loop: the HTTP server, the watcher's reads and the run's history.

    Args:
        run_id: the run; initial_peers: its peers' addresses; host_maddrs: where to listen for the DHT.
        listen: ``HOST:PORT`` of the page and ``/metrics``.
        interval_s: seconds between reads.
    """

    def __init__(self, run_id: str, initial_peers: list[str], host_maddrs: list[str], listen: str, interval_s: float):
        from p2ptrain.monitor.watcher import RunWatcher

        self.watcher = RunWatcher(run_id, initial_peers, host_maddrs)
        self.listen = listen
        self.interval_s = interval_s
        self.history = None
        self.stopping = asyncio.Event()

    async def serve(self) -> int:
        from p2ptrain.monitor.history import RunHistory
        from p2ptrain.peers.net.dht import DHTStartError
        from p2ptrain.peers.swarm.manifest import ManifestError

        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.stopping.set)
        try:
            server = await start_endpoint(self.listen, self.routes())
        except ListenError as error:
            print(f"p2ptrain monitor: {error}; pick another with --listen HOST:PORT", file=sys.stderr)
            return EXIT_FAILED
        try:
            print(f"p2ptrain monitor: connecting to run {self.watcher.run_id!r} ...", file=sys.stderr, flush=True)
            connecting = asyncio.ensure_future(asyncio.to_thread(self.watcher.connect))
            stopped = asyncio.ensure_future(self.stopping.wait())
            await asyncio.wait([connecting, stopped], return_when=asyncio.FIRST_COMPLETED)
            if not connecting.done():
                stopped.cancel()
                await asyncio.gather(connecting, return_exceptions=True)  # a thread cannot be cancelled
                return EXIT_OK
            stopped.cancel()
            try:
                run = connecting.result()
            except (DHTStartError, ManifestError) as error:
                print(f"p2ptrain monitor: {error.message}; {error.fix}", file=sys.stderr)
                return EXIT_FAILED
            self.history = RunHistory(run)
            address = bound_address(server)
            print(f"p2ptrain monitor: watching run {run['id']!r} ({run['mode']}, {run['model']}) as peer {self.watcher.peer_id}; "
                  f"page http://{address}/, metrics http://{address}/metrics, data http://{address}/api/run.json", flush=True)
            await self._read_until_stopped()
            return EXIT_OK
        finally:
            server.close()
            await asyncio.to_thread(self.watcher.close)

    async def _read_until_stopped(self) -> None:
        while not self.stopping.is_set():
            try:
                swarm = await asyncio.to_thread(self.watcher.read)
            except Exception as error:  # hivemind's timeouts and connection errors: shown on the page, retried
                logger.warning("reading the run failed: %s", error, exc_info=logger.isEnabledFor(logging.DEBUG))
                self.history.failed(f"{type(error).__name__}: {error}"[:300], time.time())
            else:
                self.history.add(swarm, time.time())
            try:
                await asyncio.wait_for(self.stopping.wait(), self.interval_s)
            except TimeoutError:
                pass

    def routes(self) -> dict:
        return {"/": self.page, "/index.html": self.page, "/api/run.json": self.run_json, "/metrics": self.metrics}

    def page(self) -> Response:
        text = importlib.resources.files("p2ptrain.monitor").joinpath("page.html").read_bytes()
        return Response(text, "text/html; charset=utf-8")

    def run_json(self) -> Response:
        if self.history is None:
            return _connecting()
        return Response(json.dumps(self.history.to_json()).encode(), "application/json")

    def metrics(self) -> Response:
        from p2ptrain.monitor.run_metrics import monitor_metrics

        if self.history is None:
            return _connecting()
        return Response(monitor_metrics(self.history.to_json()).encode(), CONTENT_TYPE)


def _connecting() -> Response:
    return Response(b'{"connecting": true}', "application/json", HTTPStatus.SERVICE_UNAVAILABLE)
