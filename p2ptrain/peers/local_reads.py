"""Reading the swarm's records from this peer's own copy when it is sure to hold all of them.

A DHT store goes to the ``num_replicas`` (5) serving nodes nearest to the
key, and every peer re-stores its progress and metrics records at least every
:data:`FULL_COPY_AFTER_S` seconds while it trains. So in a run of up to five
serving peers each of them already holds every other peer's latest record, yet
hivemind's ``dht.get(key, latest=True)`` asks every other node for it again:
in the network lab (4 peers, ``benchmarks/RESULTS.md``) those reads and the
answers to other peers' reads were most of a peer's background traffic (each
answer carries all the run's signed records, about 0.9 KB each).

:func:`read_record` reads this node's storage (and cache) without asking
anyone when the copy can be trusted: the node serves the DHT, it is among the
``num_replicas`` nearest nodes to the key that it knows of (so stores reach
it), and it has been in the swarm for at least ``FULL_COPY_AFTER_S`` (so every
live peer has stored since). Otherwise it asks the network, ``latest=True``,
as before. In a larger swarm the peers nearest to each key read locally and the
others ask; a peer whose routing table misses a nearer node may read an older
record of some peer until it learns of that node (records carry their time and
speed, and readers extrapolate from them).

:class:`LocalFirstDHT` gives hivemind's ProgressTracker the same reads.
"""

from __future__ import annotations

import functools
import time

from p2ptrain.peers.traffic import counted_as_key

# every record this module reads is re-stored at least this often by a live peer: progress
# every ``progress.REPORT_PERIOD_S`` while training and every 30 s (hivemind's metadata_expiration / 2)
# otherwise, metrics every ``training_worker.METRICS_INTERVAL_S``
FULL_COPY_AFTER_S = 60.0


def _holds_every_record(node, key_id) -> bool:
    """Whether stores under ``key_id`` reach this node (run in the DHT process)."""
    if node.protocol.client_mode:
        return False
    neighbours = node.protocol.routing_table.get_nearest_neighbors(key_id, k=node.num_replicas, exclude=node.node_id)
    if len(neighbours) < node.num_replicas:
        return True
    farthest = max(key_id.xor_distance(node_id) for node_id, _ in neighbours)
    return key_id.xor_distance(node.node_id) < farthest


async def _read(dht, node, key: str, local_copy_is_complete: bool):
    """Run in the DHT process: the record under ``key``, from the local copy when it is complete."""
    from hivemind.dht.routing import DHTID

    with counted_as_key(key):
        if local_copy_is_complete and _holds_every_record(node, DHTID.generate(source=key)):
            found = await node.get(key, latest=False)  # storage and cache first: no request when they hold it
            if found is not None:
                return found
        return await node.get(key, latest=True)


def mark_joined(dht) -> None:
    """Remember when ``dht`` started, for :func:`read_record` (``start_dht`` calls it)."""
    dht.p2ptrain_started = time.monotonic()


def read_record(dht, key: str, return_future: bool = False):
    """``dht.get(key, latest=True)``, answered from this peer's own copy when it holds every
    peer's latest record (see the module docstring).

    Args:
        dht: a running hivemind DHT (made by ``p2ptrain.peers.dht.start_dht``, which marks its start).
        key: the DHT key.
        return_future: return hivemind's MPFuture instead of waiting (as ``DHT.get``).
    """
    started = getattr(dht, "p2ptrain_started", None)
    complete = started is not None and time.monotonic() - started >= FULL_COPY_AFTER_S
    return dht.run_coroutine(functools.partial(_read, key=key, local_copy_is_complete=complete),
                             return_future=return_future)


class LocalFirstDHT:
    """A DHT whose ``get`` is :func:`read_record`, for hivemind's ProgressTracker (which reads its
    progress key as often as every ``progress.MIN_REFRESH_PERIOD_S``, always with ``latest=True``:
    ``latest`` is therefore not looked at); everything else is the DHT's."""

    def __init__(self, dht):
        self._dht = dht

    def __getattr__(self, name):
        return getattr(self._dht, name)

    def get(self, key, latest: bool = False, return_future: bool = False):
        return read_record(self._dht, key, return_future=return_future)
