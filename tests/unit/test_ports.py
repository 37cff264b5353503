"""The DHT's listening ports: a taken port is found, its holder named, and the next free one used."""

from __future__ import annotations

import os
import socket

import psutil

from p2ptrain.peers.net.ports import claim_free_ports, port_holder, port_in_use_error, port_is_free


def listener(reuse_port: bool = True) -> socket.socket:
    """A TCP listener as p2pd opens one (SO_REUSEADDR and SO_REUSEPORT), on a random port."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("0.0.0.0", 0))
    sock.listen()
    return sock


def test_a_port_held_by_a_listener_is_taken_even_one_sharing_it_with_reuseport():
    with listener() as held:
        port = held.getsockname()[1]
        assert not port_is_free("0.0.0.0", port) and not port_is_free("127.0.0.1", port)
    assert port_is_free("0.0.0.0", port)


def test_a_taken_port_moves_to_the_next_free_one_and_names_its_holder():
    with listener() as held:
        port = held.getsockname()[1]
        addresses, moves = claim_free_ports([f"/ip4/0.0.0.0/tcp/{port}", "/ip4/127.0.0.1/tcp/0"])
    assert len(moves) == 1
    move = moves[0]
    assert move.configured == port and move.port > port and addresses == [f"/ip4/0.0.0.0/tcp/{move.port}", "/ip4/127.0.0.1/tcp/0"]
    assert move.holder == f"{psutil.Process().name()} (pid {os.getpid()})"
    assert move.message == f"TCP port {port} is taken by {move.holder}: listening on port {move.port} instead"
    assert f"forward TCP port {move.port}" in move.fix and "p2ptrain config set dht.host_maddrs" in move.fix


def test_free_ports_and_port_zero_stay_as_configured():
    with listener() as probe:
        free_port = probe.getsockname()[1]
    addresses = [f"/ip4/127.0.0.1/tcp/{free_port}", "/ip4/0.0.0.0/tcp/0", "/dns4/example.org/tcp/31337"]
    assert claim_free_ports(addresses) == (addresses, [])


def test_nobody_holds_a_free_port():
    with listener() as probe:
        free_port = probe.getsockname()[1]
    assert port_holder(free_port) is None


def test_p2pds_own_words_for_a_taken_port_are_recognised():
    text = "Daemon failed to start: 2026/11/23 12:35:05 failed to listen on any addresses: [listen tcp4 0.0.0.0:39723: bind: address already in use]"
    assert port_in_use_error(text) == ("tcp", 39723)
    assert port_in_use_error("Daemon failed to start: 2026/11/23 12:35:18 failed to connect to bootstrap peers") is None
