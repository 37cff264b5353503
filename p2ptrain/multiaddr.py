"""Checking multiaddrs (``/ip4/203.0.113.5/tcp/31337/p2p/Qm...``) without libp2p.

The daemon checks the addresses of a join request and of the ``[dht]``
config before any worker starts, and the config module needs it to validate
a file: so this is a leaf, standard library only. ``peers/net/dht.py`` uses it
too before handing addresses to hivemind.
"""

from __future__ import annotations

import ipaddress
import re

MULTIADDR_EXAMPLE = "/ip4/203.0.113.5/tcp/31337/p2p/Qm..."

_HOST_PROTOCOLS = {"ip4", "ip6", "dns", "dns4", "dns6", "dnsaddr"}
_VALUED_PROTOCOLS = _HOST_PROTOCOLS | {"tcp", "udp", "p2p", "ipfs"}
_BARE_PROTOCOLS = {"quic", "quic-v1", "p2p-circuit", "ws", "wss", "tls", "noise", "webtransport", "http", "https"}
_PEER_ID_RE = re.compile(r"^[1-9A-HJ-NP-Za-km-z]{32,128}$")
_DNS_NAME_RE = re.compile(r"^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.?)+$")


def _check_value(protocol: str, value: str) -> str:
    if protocol in ("ip4", "ip6"):
        kind = ipaddress.IPv4Address if protocol == "ip4" else ipaddress.IPv6Address
        try:
            return str(kind(value))
        except ValueError:
            raise ValueError(f"{value!r} is not an {'IPv4' if protocol == 'ip4' else 'IPv6'} address") from None
    if protocol in {"dns", "dns4", "dns6", "dnsaddr"}:
        if not _DNS_NAME_RE.match(value):
            raise ValueError(f"{value!r} is not a host name")
        return value.lower()
    if protocol in {"tcp", "udp"}:
        if not value.isdigit() or int(value) > 65535:
            raise ValueError(f"port {value!r} is not in 0-65535")
        return str(int(value))
    if not _PEER_ID_RE.match(value):  # p2p / ipfs
        raise ValueError(f"{value!r} is not a peer id")
    return value


def validate_multiaddr(text: str) -> str:
    """Check that ``text`` is a multiaddr a peer can be dialled at, and return it normalised.

    Accepts ``/ip4``, ``/ip6`` and ``/dns*`` hosts, ``/tcp`` or ``/udp`` (+ ``/quic-v1``)
    ports and an optional ``/p2p/<peer id>`` (``/ipfs/`` is rewritten to ``/p2p/``).
    Surrounding spaces and a trailing slash are dropped, IP addresses normalised.

    :raises ValueError: ``'x' is not a multiaddr (why); expected e.g. /ip4/.../tcp/.../p2p/Qm...``
    """

    def refuse(reason: str) -> ValueError:
        return ValueError(f"{text!r} is not a multiaddr ({reason}); expected e.g. {MULTIADDR_EXAMPLE}")

    if not isinstance(text, str):
        raise refuse(f"got {type(text).__name__}")
    stripped = text.strip().rstrip("/")
    if not stripped.startswith("/"):
        raise refuse("it must start with '/'")
    parts = stripped[1:].split("/")
    normalised = []
    index = 0
    while index < len(parts):
        protocol = parts[index].lower()
        if protocol in _BARE_PROTOCOLS:
            normalised.append(protocol)
            index += 1
            continue
        if protocol not in _VALUED_PROTOCOLS:
            raise refuse(f"unknown protocol {parts[index]!r}")
        if index + 1 >= len(parts) or not parts[index + 1]:
            raise refuse(f"/{protocol} needs a value")
        try:
            value = _check_value(protocol, parts[index + 1])
        except ValueError as error:
            raise refuse(str(error)) from None
        normalised += ["p2p" if protocol == "ipfs" else protocol, value]
        index += 2
    if normalised[0] not in _HOST_PROTOCOLS:
        raise refuse("it must start with /ip4, /ip6 or /dns")
    if len(normalised) < 4 or normalised[2] not in {"tcp", "udp"}:
        raise refuse("the host needs a /tcp or /udp port")
    return "/" + "/".join(normalised)
