"""The reachability verdict from peers' dial-back answers, and the fix each not-direct case names."""

from __future__ import annotations

import pytest

from p2ptrain.peers.net.reachability import fix_for, rank_reached_first, verdict

PEER = "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"
HOME = [f"/ip4/192.168.1.7/tcp/31337/p2p/{PEER}", f"/ip4/127.0.0.1/tcp/31337/p2p/{PEER}"]
RELAYED = f"/ip4/11.0.0.10/tcp/31337/p2p/{PEER}/p2p-circuit/p2p/{PEER}"
LISTEN = ["/ip4/0.0.0.0/tcp/31337"]


@pytest.mark.parametrize(
    ("answers", "expected"),
    [
        ([], "unknown"),
        ([{"direct": True, "relayed": False}], "direct"),
        ([{"direct": True}, {"direct": False}], "direct"),  # half of them is enough, as in Petals
        ([{"direct": True}, {"direct": False}, {"direct": False, "relayed": True}], "relayed"),
        ([{"direct": False, "relayed": True}, {"direct": False, "relayed": False}], "relayed"),
        ([{"direct": False, "relayed": False}], "unreachable"),
    ],
)
def test_the_verdict_follows_what_the_peers_reached(answers, expected):
    assert verdict(answers) == expected


def test_a_relayed_peer_behind_nat_is_told_to_forward_its_port_and_to_expect_slower_rounds():
    fix = fix_for("relayed", LISTEN, [], HOME + [RELAYED])
    assert fix.startswith("a relay is in use, expect slower rounds")
    assert "forward TCP port 31337 to this machine in your router" in fix
    assert "dht.announce_maddrs" in fix


def test_an_unreachable_peer_with_a_global_address_is_told_to_open_its_firewall():
    fix = fix_for("unreachable", LISTEN, [], [f"/ip4/11.0.0.30/tcp/31337/p2p/{PEER}"])
    assert "open TCP port 31337 in this machine's firewall" in fix
    assert "averages as a client" in fix


def test_a_random_port_is_fixed_first_and_an_announced_address_is_named():
    assert "listen on a fixed port" in fix_for("unreachable", ["/ip4/0.0.0.0/tcp/0"], [], HOME)
    announced = ["/ip4/11.0.0.21/tcp/40000"]
    assert "/ip4/11.0.0.21/tcp/40000" in fix_for("relayed", LISTEN, announced, HOME)


@pytest.mark.parametrize("reachability", ["direct", "unknown"])
def test_nothing_to_fix_when_direct_or_not_yet_measured(reachability):
    assert fix_for(reachability, LISTEN, [], HOME) is None


def test_the_address_peers_reached_comes_first():
    public = f"/ip4/11.0.0.10/tcp/31337/p2p/{PEER}"
    assert rank_reached_first(HOME + [public], [public, "/ip4/9.9.9.9/tcp/1"]) == [public] + HOME
