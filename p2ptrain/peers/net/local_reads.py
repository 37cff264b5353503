"""The swarm's records (progress, metrics) read from this peer's own copy, and stored straight to their holders.

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

Stores cost the same way: hivemind's ``dht.store`` first searches for the
nearest nodes with ``rpc_find`` requests, and each answer carries the key's
whole value (every peer's record) though the store needs only the nodes. With
progress stored about once a step, those searches were the largest part of a
peer's background in the lab (1-2 a second, ~3.8 KB each, and as much again
answering the others'). :func:`store_record` skips the search when this node
knows fewer other serving nodes than ``num_replicas``: the nodes a search would
find are then every node it knows, so the record goes to each of them (and
into its own storage) directly. In a larger swarm it stores as hivemind does.

:class:`LocalFirstDHT` gives hivemind's ProgressTracker the same reads and stores.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time

from p2ptrain.peers.net.request_log import log_read
from p2ptrain.peers.net.traffic import counted_as_key

# every record this module reads is re-stored at least this often by a live peer: progress
# every ``progress.REPORT_PERIOD_S`` while training and every 30 s (hivemind's metadata_expiration / 2)
# otherwise, metrics every ``training_worker.METRICS_INTERVAL_S``
FULL_COPY_AFTER_S = 60.0


def _why_not_every_record(node, key_id) -> str | None:
    """Run in the DHT process: None when stores under ``key_id`` reach this node, else why not."""
    if node.protocol.client_mode:
        return "client mode"
    neighbours = node.protocol.routing_table.get_nearest_neighbors(key_id, k=node.num_replicas, exclude=node.node_id)
    if len(neighbours) < node.num_replicas:
        return None
    farthest = max(key_id.xor_distance(node_id) for node_id, _ in neighbours)
    if key_id.xor_distance(node.node_id) < farthest:
        return None
    return f"not among the {node.num_replicas} nodes nearest to the key of {len(node.protocol.routing_table.uid_to_peer_id)} known"


async def _read(dht, node, key: str, local_copy_is_complete: bool):
    """Run in the DHT process: the record under ``key``, from the local copy when it is complete."""
    from hivemind.dht.routing import DHTID

    with counted_as_key(key):
        why_not = "joined less than a minute ago" if not local_copy_is_complete else \
            _why_not_every_record(node, DHTID.generate(source=key))
        if why_not is None:
            found = await node.get(key, latest=False)  # storage and cache first: no request when they hold it
            if found is not None:
                log_read(key, "local")
                return found
            why_not = "no local copy"
        log_read(key, f"network: {why_not}")
        return await node.get(key, latest=True)


def mark_joined(dht) -> None:
    """Remember when ``dht`` started, for :func:`read_record` (``start_dht`` calls it)."""
    dht.p2ptrain_started = time.monotonic()


def read_record(dht, key: str, return_future: bool = False):
    """``dht.get(key, latest=True)``, answered from this peer's own copy when it holds every
    peer's latest record (see the module docstring).

    Args:
        dht: a running hivemind DHT (made by ``p2ptrain.peers.net.dht.start_dht``, which marks its start).
        key: the DHT key.
        return_future: return hivemind's MPFuture instead of waiting (as ``DHT.get``).
    """
    started = getattr(dht, "p2ptrain_started", None)
    complete = started is not None and time.monotonic() - started >= FULL_COPY_AFTER_S
    return dht.run_coroutine(functools.partial(_read, key=key, local_copy_is_complete=complete),
                             return_future=return_future)


async def _store(dht, node, key: str, subkey, value, expiration_time: float) -> bool:
    """Run in the DHT process: store straight to every known node when they are all the holders."""
    from hivemind.dht.routing import DHTID
    from hivemind.dht.validation import DHTRecord

    key_id, protocol = DHTID.generate(source=key), node.protocol
    with counted_as_key(key):
        holders = protocol.routing_table.get_nearest_neighbors(key_id, k=node.num_replicas, exclude=node.node_id)
        if protocol.client_mode or len(holders) >= node.num_replicas:
            return await node.store(key, value, expiration_time, subkey=subkey)
        record = DHTRecord(key_id.to_bytes(), protocol.serializer.dumps(subkey), protocol.serializer.dumps(value),
                           expiration_time)
        if protocol.record_validator is not None:
            record = dataclasses.replace(record, value=protocol.record_validator.sign_value(record))
            if not protocol.record_validator.validate(record):
                return False
        stored = protocol.storage.store(key_id, record.value, expiration_time, subkey=subkey)
        answers = await asyncio.gather(*(
            protocol.call_store(peer_id, keys=[key_id], values=[record.value], expiration_time=[expiration_time],
                                subkeys=[subkey])
            for _, peer_id in holders))
        return bool(stored) or any(answer and answer[0] for answer in answers)


def store_record(dht, key: str, subkey, value, expiration_time: float, return_future: bool = False):
    """``dht.store(key, value, expiration_time, subkey=subkey)``, without the search for the holders
    when this node knows them all (see the module docstring); returns whether a node stored it.

    Args:
        dht: a running hivemind DHT.
        key, subkey, value, expiration_time: as ``DHT.store``.
        return_future: return hivemind's MPFuture instead of waiting (as ``DHT.store``).
    """
    return dht.run_coroutine(functools.partial(_store, key=key, subkey=subkey, value=value,
                                               expiration_time=expiration_time), return_future=return_future)


class LocalFirstDHT:
    """A DHT whose ``get`` is :func:`read_record` and ``store`` :func:`store_record`, for hivemind's
    ProgressTracker (which reads its progress key as often as every ``progress.MIN_REFRESH_PERIOD_S``,
    always with ``latest=True``: ``latest`` is therefore not looked at, and stores about once a
    step); everything else is the DHT's."""

    def __init__(self, dht):
        self._dht = dht

    def __getattr__(self, name):
        return getattr(self._dht, name)

    def get(self, key, latest: bool = False, return_future: bool = False):
        return read_record(self._dht, key, return_future=return_future)

    def store(self, key, value, expiration_time, subkey=None, return_future: bool = False):
        return store_record(self._dht, key, subkey, value, expiration_time, return_future=return_future)
