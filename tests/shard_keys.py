"""Peer identities whose progress records spread evenly over a layout of shards (``progress_shards``).

Which shard holds a peer's record follows from its signing key's hash, so a
few random identities may crowd one shard; a test that counts what a reader
of one shard sees draws its identities until they spread.
"""

from __future__ import annotations

from pathlib import Path

from hivemind.dht.crypto import RSASignatureValidator

from p2ptrain.peers.net.identity import create_identity
from p2ptrain.peers.swarm import progress_shards


def spread_identities(paths: list[Path], shards: int, most: int) -> None:
    """Write an identity to each of ``paths`` (any there is replaced) such that at most ``most`` of their peers'
    records fall to one shard of ``shards``: new keys are drawn until they do."""
    while True:
        for path in paths:
            path.unlink(missing_ok=True)
        keys = [create_identity(path) for path in paths]
        places = [progress_shards.shard_of(RSASignatureValidator(key).local_public_key, shards) for key in keys]
        if max(places.count(shard) for shard in range(shards)) <= most:
            return
