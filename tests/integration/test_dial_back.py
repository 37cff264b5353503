"""The dial-back protocol between real hivemind peers on 127.0.0.1 (NAT and firewalls: tests/netlab)."""

from __future__ import annotations

import asyncio

import pytest

from p2ptrain.peers.net.dht import start_dht, visible_addresses
from p2ptrain.peers.net.dial_back import DialBack, dial_from_fresh_host

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(120)]
LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


@pytest.fixture
def two_peers(tmp_path):
    first = start_dht([], tmp_path / "a.key", host_maddrs=LOOPBACK, start_timeout=30)
    second = start_dht(visible_addresses(first), tmp_path / "b.key", host_maddrs=LOOPBACK, start_timeout=30)
    services = [DialBack(first), DialBack(second)]
    try:
        for service in services:
            service.start()
        yield first, second, services
    finally:
        for service in services:
            service.shutdown()
        second.shutdown()
        first.shutdown()


def test_a_peer_is_dialed_back_directly_by_the_peer_it_joined(two_peers):
    first, second, (_, asking) = two_peers
    result = asking.check()
    assert result["reachability"] == "direct"
    assert (result["asked"], result["answered"]) == (1, 1)
    assert result["reached"] == [visible_addresses(second)[0]]


def test_the_first_peer_of_a_run_has_nobody_to_ask(tmp_path):
    alone = start_dht([], tmp_path / "a.key", host_maddrs=LOOPBACK, start_timeout=30)
    service = DialBack(alone)
    try:
        service.start()
        result = service.check()
        assert (result["reachability"], result["asked"]) == ("unknown", 0)
    finally:
        service.shutdown()
        alone.shutdown()


def test_a_dial_back_reaches_only_the_peer_that_owns_the_address(two_peers):
    first, second, _ = two_peers
    # the first peer's address, claimed for the second's id: the libp2p handshake proves it is someone else
    stolen = visible_addresses(first)[0].rsplit("/p2p/", 1)[0] + f"/p2p/{second.peer_id.to_base58()}"
    answer = asyncio.run(dial_from_fresh_host(second.peer_id, [stolen]))
    assert answer == {"direct": False, "relayed": False, "reached": None}



def test_the_check_at_join_runs_while_the_worker_sets_up(two_peers, tmp_path):
    """A joining worker loads its model while its peers dial it back: ``start_join`` does not wait for them."""
    from p2ptrain.peers.net.network import PeerNetwork

    first, _, _ = two_peers
    joining = start_dht(visible_addresses(first), tmp_path / "c.key", host_maddrs=LOOPBACK, start_timeout=30)
    network = PeerNetwork(joining, lambda report: None)
    try:
        network.start_join()
        in_flight = network._checking
        assert in_flight is not None and not in_flight.done()  # a helper's fresh p2pd takes far longer than this
        assert network.reachability == "unknown"
        network.finish_join()
        assert in_flight.done()
        assert (network.reachability, network.averaging_client) == ("direct", False)
    finally:
        network.shutdown()
        joining.shutdown()
