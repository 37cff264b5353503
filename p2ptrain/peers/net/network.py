"""A worker's own place in the network: how peers reach it (measured), the addresses to hand out, its role in averaging.

At join, once the DHT is up, the worker asks peers of the swarm to dial it
back (``dial_back``) while it reads the manifest and loads the model (a helper's
direct dial to an address behind NAT takes its whole 5-s timeout to fail), and
takes the verdict before the averagers start. A peer they cannot reach
directly averages as a *client*: it sends its share to peers that reduce and
never reduces a part itself. That is the workaround for two limits of
hivemind's p2pd (``docs/nat.md``): a relayed connection is reset after 128 KiB,
while one averaging part is larger, and hole punching does not start in a swarm
with few public peers. So no averaging data ever has to flow between two
peers behind NAT. Such a peer also stops serving the DHT (``dht.stop_serving``):
other peers' requests would reach it only through a relay, at twice the bytes.
The role is fixed for the life of the worker (hivemind's averagers take it when
they start); the reachability is checked again in the background and every
change is reported to the daemon as a ``network`` report.
"""

from __future__ import annotations

import logging
from typing import Callable

from p2ptrain.peers.net.reachability import DIRECT, UNKNOWN, rank_reached_first

logger = logging.getLogger(__name__)


class PeerNetwork:
    """This worker's measured reachability and best addresses.

    Args:
        dht: the worker's running DHT.
        report: sends a report to the daemon (``worker_pipe.Network``, ``worker_pipe.Traffic``).
        client_mode: the DHT is a client (``dht.client_mode``): it averages as a client whatever it measures.
        meter: the ``traffic.TrafficMeter`` installed before the DHT started; its rates are
            reported from ``watch`` on.
    """

    def __init__(self, dht, report: Callable[[object], None], client_mode: bool = False, meter=None):
        from p2ptrain.peers.net.dht import visible_addresses
        from p2ptrain.peers.net.dial_back import DialBack

        self.dht, self._report, self.client_mode = dht, report, client_mode
        self.reachability = UNKNOWN
        self.addresses = visible_addresses(dht)
        self.averaging_client = client_mode
        self._first = self._result = self._checking = None
        self._dial_back = DialBack(dht)
        self._meter, self._traffic = meter, None

    def start_join(self) -> None:
        """Serve other peers' dial-back requests and have this peer dialed back by those it is connected to,
        in the background: :meth:`finish_join` takes the verdict. The worker loads its model meanwhile."""
        try:
            self._dial_back.start()
            self._checking = self._dial_back.start_check()
        except Exception:
            logger.exception("Could not measure reachability at join; averaging as a reducer")

    def finish_join(self) -> None:
        """Wait for the dial-back that :meth:`start_join` began and fix this peer's role in averaging
        (``averaging_client``): a client when they could not dial it directly, which then serves no DHT
        requests either. Without a verdict (the check failed) it averages as a reducer."""
        checking, self._checking = self._checking, None
        if checking is None:
            return
        try:
            self._first = self._dial_back.result(checking)
        except Exception:
            logger.exception("Could not measure reachability at join; averaging as a reducer")
            return
        self._take(self._first)
        self.averaging_client = self.client_mode or self.reachability not in (DIRECT, UNKNOWN)
        if self.averaging_client and not self.client_mode:
            from p2ptrain.peers.net.dht import stop_serving

            logger.info("Not directly reachable (%s): averaging as a client and serving no DHT requests", self.reachability)
            try:
                stop_serving(self.dht)
            except Exception:
                logger.exception("Could not stop serving the DHT; other peers' requests reach this one through a relay")

    def watch(self) -> None:
        """Check reachability again in the background, and measure traffic; each result goes to the daemon."""
        from p2ptrain.peers.net.traffic import TrafficReporter

        self._dial_back.watch(self._on_result, first=self._first)
        if self._first is not None:
            self._send()
        if self._meter is not None:
            self._traffic = TrafficReporter(self._meter, self.dht, self._report)
            self._traffic.start()

    @property
    def checked_at(self) -> float | None:
        """When the last reachability check ended (None before the first)."""
        return (self._result or {}).get("checked_at")

    def _take(self, result: dict) -> None:
        self.reachability = result["reachability"]
        if result.get("addresses"):
            self.addresses = rank_reached_first(result["addresses"], result.get("reached", []))
        self._result = result

    def _on_result(self, result: dict) -> None:
        before = self.reachability
        self._take(result)
        if before != self.reachability:
            logger.info("Reachability changed from %s to %s", before, self.reachability)
        self._send()

    def _send(self) -> None:
        from p2ptrain.worker_pipe import Network

        result = self._result
        self._report(Network(reachability=self.reachability, addresses=self.addresses,
                             checked_at=result.get("checked_at"), asked=result.get("asked", 0),
                             answered=result.get("answered", 0), reached=result.get("reached", []),
                             averaging_client=self.averaging_client))

    def shutdown(self) -> None:
        if self._traffic is not None:
            self._traffic.shutdown()
        self._dial_back.shutdown()
