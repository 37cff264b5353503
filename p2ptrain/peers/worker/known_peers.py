"""The peers a worker was connected to, remembered beside its checkpoint.

A run's creator has no bootstrap address to give its DHT after a restart: it
finds its swarm again through the peers it was connected to when it last
checkpointed. The file is a hint only: unreadable or stale, it is ignored.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

logger = logging.getLogger(__name__)

REMEMBERED_PEERS = 20


def peers_file(checkpoint_file: Path) -> Path:
    """Where the peers of the run checkpointed at ``checkpoint_file`` are remembered."""
    return checkpoint_file.with_suffix(".peers.json")


async def connected_peer_addresses(dht, node) -> list[str]:
    """Run in the DHT process: dialable multiaddrs (with /p2p/ID) of the peers it is connected to."""
    peers = await node.p2p.list_peers()
    return [f"{address}/p2p/{peer.peer_id.to_base58()}" for peer in peers for address in peer.addrs
            if "p2p-circuit" not in str(address)]


def remembered_peers(path: Path) -> list[str]:
    """The multiaddrs remembered at ``path``; empty if there are none or the file is unreadable."""
    try:
        addresses = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return [address for address in addresses if isinstance(address, str)] if isinstance(addresses, list) else []


def remember_peers(dht, path: Path) -> None:
    """Write the addresses of the peers ``dht`` is connected to into ``path`` (never raises)."""
    try:
        addresses = dht.run_coroutine(connected_peer_addresses, return_future=True).result(timeout=5)
        if addresses:
            path.write_text(json.dumps(addresses[:REMEMBERED_PEERS]))
    except Exception as error:  # only a hint for the next start: never fail a checkpoint for it
        logger.info("Could not remember the connected peers: %r", error)
