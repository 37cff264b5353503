"""What every light peer of the network lab shares (``progress_peer.py``, ``tracker_peer.py``): its arguments and its DHT.

A light peer's DHT starts as a training worker's does: port 31337 on every
interface, relays on, a peer behind NAT asking its bootstrap peer for a relay
slot. ``light_swarm.LightSwarm`` starts the scripts with these arguments.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def arguments(description: str) -> argparse.ArgumentParser:
    """A parser with the arguments every light peer takes; a script adds its own."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--identity", type=Path, required=True, help="the peer's key file (made if missing)")
    parser.add_argument("--addresses", type=Path, required=True, help="where to write the peer's addresses (JSON)")
    parser.add_argument("--stop", type=Path, required=True, help="stop once this file exists")
    parser.add_argument("--peers", nargs="*", default=[], help="bootstrap addresses; none to start the swarm")
    parser.add_argument("--run", default="lab")
    parser.add_argument("--limit-s", type=float, default=600, help="stop after this many seconds in any case")
    return parser


def start(options: argparse.Namespace):
    """This peer's DHT, its addresses written to ``options.addresses``."""
    from p2ptrain.peers.net.dht import start_dht, visible_addresses

    dht = start_dht(options.peers, options.identity, host_maddrs=["/ip4/0.0.0.0/tcp/31337"],
                    use_auto_relay=bool(options.peers), start_timeout=120)
    options.addresses.write_text(json.dumps(visible_addresses(dht)))
    return dht
