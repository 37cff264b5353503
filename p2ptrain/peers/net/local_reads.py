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
others ask the key's holders: hivemind's ``latest=True`` asks every node among
the 20 nearest to the key (it never stops early), and every answer carries all
N peers' records, so each read cost min(N - 1, 20) x N records (the scale
model's first redesign, issue 25). A peer now asks :data:`HOLDERS_PER_READ` (one)
of the key's ``num_replicas`` nearest nodes that it remembers for its stores
(see below), picked at random so that the swarm's reads are spread over all of
them, another one when one does not answer. Every live peer stores to all of
them, so each holds every record unless it joined in the last minute. The
reader merges each answer into the records it read before (the newest of each
peer's, until it expires), so a new holder's missing records are filled in
from earlier answers. Asking two holders for that (until 022d5d1) made the
holders answer every read twice, and since peers behind NAT serve nothing the
holders are the few public peers. Only when no holder answers, and the reader
remembers no record, does it search as hivemind does. A peer whose
routing table misses a nearer node may read an older record of some peer until
it learns of that node (records carry their time and speed, and readers
extrapolate from them).

Stores cost the same way: hivemind's ``dht.store`` first searches for the
nearest nodes with ``rpc_find`` requests, and each answer carries the key's
whole value (every peer's record) though the store needs only the nodes. With
progress stored about once a step, those searches were the largest part of a
peer's background in the lab (1-2 a second, ~3.8 KB each, and as much again
answering the others'; at 8 peers 3-4 a second, 23-28 KB/s, issue 25).
:func:`store_record` sends the signed record straight to the holders with
``rpc_store`` (and into this node's own storage when it is one of them), and
searches for them rarely and cheaply:

- while this node knows fewer other serving nodes than ``num_replicas``, the
  nodes a search would find are every node it knows: no search at all;
- past that, it remembers the nearest nodes a search found for the key for
  :data:`HOLDERS_MEMORY_S` and stores to the ``num_replicas`` nearest of them
  that answer (with any nearer node its routing table has learned of since);
  it searches again when the memory expires or after a remembered holder did
  not answer a store (that store goes on to the next nearest nodes found, as
  hivemind's does). The search asks for the key's id with its lowest bit
  flipped: XOR order is the same for any two node ids that differ above that
  bit, so it finds the same nearest nodes, but no node stores a record under
  that id, so its answers carry node lists, not the run's records.

A client-mode node (a peer behind NAT: ``dht.stop_serving``) stores and reads
the same way, to and from the holders a search found, never itself: no one
stores to it, and its routing table knows only the serving nodes it has asked,
so it always searches (once a key per :data:`HOLDERS_MEMORY_S`).

:class:`LocalFirstDHT` gives hivemind's ProgressTracker the same reads and stores.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import random
import time

from p2ptrain.peers.net.request_log import log_read
from p2ptrain.peers.net.traffic import counted_as_key

# every record this module reads is re-stored at least this often by a live peer: progress
# every ``progress.REPORT_PERIOD_S`` while training and every 30 s (hivemind's metadata_expiration / 2)
# otherwise, metrics every ``training_worker.METRICS_INTERVAL_S``
FULL_COPY_AFTER_S = 60.0
# how long a key's holders found by a search are stored to without searching again. A node that joins
# among them is found by the first store after the memory expires: a peer storing at least every 30 s
# (see above) reaches it within 30 + 30 s of its joining, so its copy is complete by FULL_COPY_AFTER_S,
# as read_record assumes. One search a key per 30 s replaces one a store (3-4 a second at 8 peers).
HOLDERS_MEMORY_S = 30.0
# how many of a key's holders a peer that is none asks at each read (see the module docstring)
HOLDERS_PER_READ = 1


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


async def _read(dht, node, key: str, local_copy_is_complete: bool, max_age_s: float = 0.0, search: bool = True):
    """Run in the DHT process: the record under ``key``, from the local copy when it is complete, else
    from what a holder answered at most ``max_age_s`` ago, else from the key's holders, else (unless not
    ``search``: None) from hivemind's search."""
    from hivemind.dht.routing import DHTID

    key_id = DHTID.generate(source=key)
    with counted_as_key(key):
        why_not = "joined less than a minute ago" if not local_copy_is_complete else _why_not_every_record(node, key_id)
        if why_not is None:
            found = await node.get(key, latest=False)  # storage and cache first: no request when they hold it
            if found is not None:
                log_read(key, "local")
                return found
            why_not = "no local copy"
        answered_at = getattr(node, "p2ptrain_answered_at", {}).get(key_id)
        if answered_at is not None and time.monotonic() - answered_at <= max_age_s:
            found = await _decoded(node, key_id, _with_earlier_answers(node, key_id, None))
            if found is not None:
                log_read(key, f"remembered: {why_not}")
                return found
        found = await _read_from_holders(node, key_id,
                                         trust_routing_table=local_copy_is_complete and not node.protocol.client_mode)
        if found is not None:
            log_read(key, f"holders: {why_not}")
            return found
        if not search:
            log_read(key, f"nothing: {why_not}; the holders answered nothing")
            return None
        log_read(key, f"network: {why_not}; the holders answered nothing")
        return await node.get(key, latest=True)


async def _read_from_holders(node, key_id, trust_routing_table: bool):
    """Run in the DHT process: the newest record of each subkey (each peer) in the answers of
    :data:`HOLDERS_PER_READ` of ``key_id``'s holders and in the earlier answers, decoded as ``node.get``
    decodes it; None when no holder answered, or none held a record and no earlier answer had one (the
    caller then searches as hivemind does: a peer that found nobody's record would take itself to be alone).

    Args:
        node: this process's DHT node.
        key_id: the key's DHT id.
        trust_routing_table: the node serves and has been in the swarm long enough for its routing
            table to know the swarm: when it knows fewer other nodes than ``num_replicas``, they are
            all holders (no search, as for a store). Otherwise the holders are found as for a store.
    """
    protocol = node.protocol
    known = protocol.routing_table.get_nearest_neighbors(key_id, k=node.num_replicas, exclude=node.node_id)
    if trust_routing_table and len(known) < node.num_replicas:
        holders = list(known)
    else:  # the key's holders but this node, whose own copy is not complete: not the next nearest instead
        candidates = [(node_id, peer_id) for node_id, peer_id in await _holder_candidates(node, key_id)
                      if node_id != node.node_id or not protocol.client_mode]  # a client holds nothing
        holders = [(node_id, peer_id) for node_id, peer_id in candidates[:node.num_replicas] if node_id != node.node_id]
    random.shuffle(holders)  # spread the swarm's reads over every holder, not the nearest two
    merged = _search_state(node, key_id)
    answered = 0  # holders that answered, with or without a record
    while answered < HOLDERS_PER_READ and holders:
        wanted = HOLDERS_PER_READ - answered
        asked, holders = holders[:wanted], holders[wanted:]
        answers = await asyncio.gather(*(protocol.call_find(peer_id, [key_id]) for _, peer_id in asked))
        for (node_id, peer_id), answer in zip(asked, answers):
            if answer is None:  # as a store to it: searches skip it a while, and the holders are found again
                node.blacklist.register_failure(peer_id)
                _forget_holders(node, key_id)
                continue
            answered += 1
            merged.add_candidate(_with_earlier_answers(node, key_id, answer[key_id][0]), source_node_id=node_id)
    if answered:
        if getattr(node, "p2ptrain_answered_at", None) is None:
            node.p2ptrain_answered_at = {}
        node.p2ptrain_answered_at[key_id] = time.monotonic()
    merged.finish_search()
    return await merged.future


def _search_state(node, key_id):
    """hivemind's merge of the answers of a read, which decodes the result as ``node.get`` does."""
    from hivemind.dht.node import _SearchState

    return _SearchState(key_id, sufficient_expiration_time=float("inf"), serializer=node.protocol.serializer,
                        record_validator=node.protocol.record_validator)


async def _decoded(node, key_id, candidate):
    """Run in the DHT process: ``candidate`` (a value as a holder answers it) decoded as ``node.get``
    decodes it; None for None."""
    state = _search_state(node, key_id)
    state.add_candidate(candidate, source_node_id=node.node_id)
    state.finish_search()
    return await state.future


def _with_earlier_answers(node, key_id, candidate):
    """Run in the DHT process: a holder's answer for ``key_id`` merged into what this node read of it
    before (each subkey's newest entry that has not expired), remembered for the next read, and returned
    as a copy; an answer without subkeys as it is."""
    from hivemind.dht.storage import DictionaryDHTValue
    from hivemind.utils import ValueWithExpiration

    if candidate is not None and not isinstance(candidate.value, DictionaryDHTValue):
        return candidate
    memory = getattr(node, "p2ptrain_read_entries", None)
    if memory is None:
        memory = node.p2ptrain_read_entries = {}
    entries = memory.setdefault(key_id, DictionaryDHTValue())
    for subkey, entry in (candidate.value.items() if candidate is not None else ()):
        entries.store(subkey, entry.value, entry.expiration_time)
    merged = DictionaryDHTValue()
    for subkey, entry in entries.items():  # expired entries leave here
        merged.store(subkey, entry.value, entry.expiration_time)
    if not len(merged):
        return candidate
    return ValueWithExpiration(merged, merged.latest_expiration_time)


def mark_joined(dht) -> None:
    """Remember when ``dht`` started, for :func:`read_record` (``start_dht`` calls it)."""
    dht.p2ptrain_started = time.monotonic()


def read_record(dht, key: str, return_future: bool = False, max_age_s: float = 0.0, search: bool = True):
    """``dht.get(key, latest=True)``, answered from this peer's own copy when it holds every
    peer's latest record, else by :data:`HOLDERS_PER_READ` of the key's holders (see the module docstring).

    Args:
        dht: a running hivemind DHT (made by ``p2ptrain.peers.net.dht.start_dht``, which marks its start).
        key: the DHT key.
        return_future: return hivemind's MPFuture instead of waiting (as ``DHT.get``).
        max_age_s: what a holder answered this many seconds ago or less, merged with the earlier
            answers, is fresh enough: no request (the swarm view, every 15 s, takes the progress the
            ProgressTracker's reads keep fresh). 0: ask.
        search: when the holders hold nothing, search the swarm as hivemind does (False: None), for a
            key that is often empty, such as an averaging group's while nobody leads one.
    """
    started = getattr(dht, "p2ptrain_started", None)
    complete = started is not None and time.monotonic() - started >= FULL_COPY_AFTER_S
    return dht.run_coroutine(functools.partial(_read, key=key, local_copy_is_complete=complete, max_age_s=max_age_s,
                                               search=search), return_future=return_future)


async def _read_each(dht, node, keys: list[str], local_copy_is_complete: bool):
    """Run in the DHT process: :func:`_read` of each of ``keys`` at once, as one value (the list of what each
    found, None where nothing) expiring with the latest of them; only the first key is searched for when its
    holders hold nothing."""
    from hivemind.utils import ValueWithExpiration

    found = await asyncio.gather(*(_read(dht, node, key, local_copy_is_complete, search=index == 0)
                                   for index, key in enumerate(keys)))
    return ValueWithExpiration(list(found), max((each.expiration_time for each in found if each is not None), default=-float("inf")))


def read_records(dht, keys: list[str], return_future: bool = False):
    """:func:`read_record` of each of ``keys`` at once: a ``ValueWithExpiration`` whose value lists what each
    key's read found (None where nothing), e.g. a shard of the progress records and the shards' summaries
    (``progress_shards``). Keys after the first hold what is often absent (no summary in a small swarm): when
    their holders hold nothing, they are not searched for across the swarm (hivemind's search asks every
    node, and the first key's read would wait for it).

    Args:
        dht: a running hivemind DHT (made by ``p2ptrain.peers.net.dht.start_dht``).
        keys: the DHT keys, read at once.
        return_future: return hivemind's MPFuture instead of waiting (as ``DHT.get``).
    """
    started = getattr(dht, "p2ptrain_started", None)
    complete = started is not None and time.monotonic() - started >= FULL_COPY_AFTER_S
    return dht.run_coroutine(functools.partial(_read_each, keys=keys, local_copy_is_complete=complete),
                             return_future=return_future)


async def _search_holders(node, key_id) -> dict:
    """Run in the DHT process: the nodes nearest to ``key_id``, nearest first (this one included, up
    to a k-bucket: a holder that does not answer has a successor), found by a search whose answers
    carry no record (see the module docstring)."""
    from hivemind.dht.routing import DHTID

    twin = DHTID(int(key_id) ^ 1)  # the same nearest nodes, and nobody's record under it
    found = await node.find_nearest_nodes([twin], k_nearest=node.protocol.bucket_size, exclude_self=False)
    return found[twin]


async def _holder_candidates(node, key_id) -> list:
    """Run in the DHT process: ``(node id, peer id)`` of the nodes nearest to ``key_id``, nearest first:
    those the last search found (searching when it is older than ``HOLDERS_MEMORY_S`` or was
    forgotten), with any node the routing table has learned of since, less the nodes that did not
    answer lately (hivemind's blacklist)."""
    memory = getattr(node, "p2ptrain_holders", None)
    if memory is None:
        memory = node.p2ptrain_holders = {}  # key_id -> (monotonic time until which it holds, nodes found)
    remembered = memory.get(key_id)
    if remembered is None or remembered[0] <= time.monotonic():
        searches = getattr(node, "p2ptrain_holder_searches", None)
        if searches is None:
            searches = node.p2ptrain_holder_searches = {}
        search = searches.get(key_id)
        if search is None:  # stores of one key at once share one search
            search = searches[key_id] = asyncio.ensure_future(_search_holders(node, key_id))
            search.add_done_callback(lambda _: searches.pop(key_id, None))
        found = await asyncio.shield(search)
        remembered = (time.monotonic() + HOLDERS_MEMORY_S, found)
        # a short answer (the search failed somewhere) is not kept by a serving node, which knows the
        # swarm's other serving nodes; a client's answer is short whenever few peers serve
        if len(found) > node.num_replicas or (node.protocol.client_mode and found):
            memory[key_id] = remembered
    candidates = dict(remembered[1])
    candidates.update(node.protocol.routing_table.get_nearest_neighbors(key_id, k=node.protocol.bucket_size,
                                                                        exclude=node.node_id))
    return [(node_id, candidates[node_id]) for node_id in sorted(candidates, key=key_id.xor_distance)
            if candidates[node_id] not in node.blacklist]


def _forget_holders(node, key_id) -> None:
    """Search for ``key_id``'s holders again at the next store."""
    getattr(node, "p2ptrain_holders", {}).pop(key_id, None)


async def _store_to(node, holders: list, key_id, subkey, record, expiration_time: float) -> tuple[bool, list]:
    """Run in the DHT process: ``record`` into each holder's storage (this node's directly);
    whether one stored it, and the holders that answered."""
    protocol, stored, answered, others = node.protocol, False, [], []
    for node_id, peer_id in holders:
        if node_id == node.node_id:
            stored = bool(protocol.storage.store(key_id, record.value, expiration_time, subkey=subkey)) or stored
            answered.append(node_id)
        else:
            others.append((node_id, peer_id))
    answers = await asyncio.gather(*(
        protocol.call_store(peer_id, keys=[key_id], values=[record.value], expiration_time=[expiration_time],
                            subkeys=[subkey])
        for _, peer_id in others))
    for (node_id, peer_id), answer in zip(others, answers):
        if answer is None:  # hivemind dropped it from the routing table; searches skip it a while
            node.blacklist.register_failure(peer_id)
        else:
            answered.append(node_id)
            stored = stored or bool(answer[0])
    return stored, answered


async def _store(dht, node, key: str, subkey, value, expiration_time: float) -> bool:
    """Run in the DHT process: store straight to the key's holders (see the module docstring)."""
    from hivemind.dht.routing import DHTID
    from hivemind.dht.validation import DHTRecord

    key_id, protocol = DHTID.generate(source=key), node.protocol
    with counted_as_key(key):
        record = DHTRecord(key_id.to_bytes(), protocol.serializer.dumps(subkey), protocol.serializer.dumps(value),
                           expiration_time)
        if protocol.record_validator is not None:
            record = dataclasses.replace(record, value=protocol.record_validator.sign_value(record))
            if not protocol.record_validator.validate(record):
                return False
        serving = not protocol.client_mode
        known = protocol.routing_table.get_nearest_neighbors(key_id, k=node.num_replicas, exclude=node.node_id)
        if serving and len(known) < node.num_replicas:  # every node it knows is a holder
            return (await _store_to(node, [(node.node_id, node.peer_id), *known], key_id, subkey, record,
                                    expiration_time))[0]
        candidates = [(node_id, peer_id) for node_id, peer_id in await _holder_candidates(node, key_id)
                      if serving or node_id != node.node_id]  # a client holds nothing for others
        stored, answered = False, 0
        while answered < node.num_replicas and candidates:  # as hivemind: the nearest that answer
            wanted = node.num_replicas - answered
            holders, candidates = candidates[:wanted], candidates[wanted:]
            stored_now, answering = await _store_to(node, holders, key_id, subkey, record, expiration_time)
            stored, answered = stored or stored_now, answered + len(answering)
            if len(answering) < len(holders):  # a holder left: the holders may have changed
                _forget_holders(node, key_id)
        return stored


def store_record(dht, key: str, subkey, value, expiration_time: float, return_future: bool = False):
    """``dht.store(key, value, expiration_time, subkey=subkey)``, without a search for the holders
    at each store (see the module docstring); returns whether a node stored it.

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
    step) and its matchmaking (``peers.robust.matchmaking``); everything else is the DHT's.

    Args:
        dht: a running hivemind DHT (made by ``p2ptrain.peers.net.dht.start_dht``).
        search: as :func:`read_record`'s, for every read.
    """

    def __init__(self, dht, search: bool = True):
        self._dht, self._search = dht, search

    def __getattr__(self, name):
        return getattr(self._dht, name)

    def get(self, key, latest: bool = False, return_future: bool = False):
        return read_record(self._dht, key, return_future=return_future, search=self._search)

    def store(self, key, value, expiration_time, subkey=None, return_future: bool = False):
        return store_record(self._dht, key, subkey, value, expiration_time, return_future=return_future)
