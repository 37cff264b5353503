"""How other peers reach this one, as measured by a dial-back, and what to do when they cannot.

``p2ptrain.peers.net.dial_back`` asks a few peers of the swarm to dial this peer's
announced addresses from a fresh libp2p host. Their answers make the verdict
(:func:`verdict`):

- ``direct``: at least half of the peers that answered reached one of its
  addresses without a relay (a public IP, a forwarded port, or the same LAN);
- ``relayed``: they reached it only through a libp2p relay (``/p2p-circuit``):
  it takes part, but averaging between two relayed peers cannot go through the
  relay (see ``docs/nat.md``), so it averages as a client;
- ``unreachable``: nobody could dial it: it averages as a client (sends its
  share to peers that reduce, never reduces itself);
- ``unknown``: nobody was asked yet (the first peer of a run), or none answered.

:func:`fix_for` says what the volunteer can do about each not-direct case.
Pure functions, no hivemind: the daemon and ``doctor`` use them too.
"""

from __future__ import annotations

import ipaddress
import re

DIRECT, RELAYED, UNREACHABLE, UNKNOWN = "direct", "relayed", "unreachable", "unknown"
REACHABILITIES = (DIRECT, RELAYED, UNREACHABLE, UNKNOWN)
_TCP_PORT = re.compile(r"/tcp/(\d+)")


def is_relayed(address: str) -> bool:
    """True for an address through a libp2p relay (``.../p2p-circuit/...``)."""
    return "p2p-circuit" in address.split("/")


def verdict(answers: list[dict]) -> str:
    """The reachability that the answers of the asked peers show.

    Args:
        answers: one dict per peer that answered: ``direct`` (it reached a
            direct address), ``relayed`` (it reached a relayed one).
    """
    if not answers:
        return UNKNOWN
    if 2 * sum(bool(answer.get("direct")) for answer in answers) >= len(answers):
        return DIRECT
    if any(answer.get("relayed") for answer in answers):
        return RELAYED
    return UNREACHABLE


def listen_port(host_maddrs: list[str]) -> int | None:
    """The first fixed TCP port this peer listens on (None when it is random, ``/tcp/0``, or there is none)."""
    for address in host_maddrs:
        match = _TCP_PORT.search(address)
        if match and int(match.group(1)):
            return int(match.group(1))
    return None


def has_global_address(addresses: list[str]) -> bool:
    """True when one of the (direct) addresses is a global IP: the machine is not behind NAT."""
    for address in addresses:
        parts = address.split("/")
        if len(parts) > 2 and parts[1] in ("ip4", "ip6") and not is_relayed(address):
            try:
                if ipaddress.ip_address(parts[2]).is_global:
                    return True
            except ValueError:
                continue
    return False


def fix_for(reachability: str, host_maddrs: list[str], announce_maddrs: list[str], addresses: list[str]) -> str | None:
    """What the volunteer can do so others dial this peer directly; None when nothing is needed.

    Args:
        reachability: the measured verdict.
        host_maddrs: ``dht.host_maddrs`` (where it listens).
        announce_maddrs: ``dht.announce_maddrs`` (what it announces instead, if set).
        addresses: what it announces now, to tell a firewall (a global IP) from a NAT.
    """
    if reachability not in (RELAYED, UNREACHABLE):
        return None
    port = listen_port(host_maddrs)
    if port is None:
        return ("listen on a fixed port (p2ptrain config set dht.host_maddrs '[\"/ip4/0.0.0.0/tcp/31337\"]'), "
                "then forward that TCP port to this machine in your router")
    if has_global_address(addresses):
        where = f"open TCP port {port} in this machine's firewall (e.g. sudo ufw allow {port}/tcp)"
    else:
        where = f"forward TCP port {port} to this machine in your router"
    if announce_maddrs:
        where += f", and check that dht.announce_maddrs ({', '.join(announce_maddrs)}) is your public address"
    else:
        where += ("; if your router maps it to another port, set dht.announce_maddrs to "
                  "/ip4/<your public IP>/tcp/<that port>")
    if reachability == RELAYED:
        return f"a relay is in use, expect slower rounds: {where}"
    return f"{where}; until then this peer averages as a client (it sends its share, others reduce)"


def rank_reached_first(addresses: list[str], reached: list[str]) -> list[str]:
    """``addresses`` with those that peers reached by dialing back first (in their order), the rest after."""
    first = [address for address in dict.fromkeys(reached) if address in addresses]
    return first + [address for address in addresses if address not in first]
