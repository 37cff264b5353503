"""Real hivemind DHT peers on 127.0.0.1 whose traffic p2ptrain's meter counts.

The meter is installed in the test process before the peers start, so their DHT
processes (forked from it) count every request they send, by the kind of its key.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from p2ptrain.peers.net.dht import start_dht, visible_addresses
from p2ptrain.peers.net.traffic import TrafficMeter

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


def installed_meter() -> TrafficMeter:
    """A meter counting this process's hivemind messages and those of the processes it forks from now on."""
    meter = TrafficMeter()
    meter.install()
    return meter


@contextlib.contextmanager
def loopback_dhts(directory: Path, count: int):
    """``count`` DHT peers, each after the first joining the first; all shut down on leaving the block."""
    started = []
    try:
        for index in range(count):
            initial = [address for dht in started[:1] for address in visible_addresses(dht)]
            started.append(start_dht(initial, directory / f"peer{index}.key", host_maddrs=LOOPBACK, start_timeout=30))
        yield started
    finally:
        for dht in reversed(started):
            dht.shutdown()


def sent_and_received(meter: TrafficMeter, kind: str) -> float:
    """Bytes of ``kind`` the meter counted so far, both directions."""
    return sum(meter.totals()[kind])
