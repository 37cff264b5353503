"""A model of each peer's background traffic past the machine, for swarms of up to thousands of peers (issue 25).

The scale lab (``scale.py``) measures N = 2, 4 and 8 peers on one machine; 100 or 1,000 do not fit
on it. This model counts the DHT requests that p2ptrain and hivemind make and answer, as their code
makes them, with the sizes and rates fitted to the 8-peer request log. It then checks itself against
every measured row and projects N = 16, 32, 100 and 1,000.

Background here is what each peer's meter counts on the DHT: the kinds ``progress``, ``metrics``,
``matchmaking`` and ``dht`` (answering others). Not the averaging tensors, and not ``other``
(libp2p's own bytes, relaying for peers behind NAT), which this model does not cover. hivemind
refreshes no routing buckets by default, so the DHT's upkeep is the answers to others' requests.
Per key (the progress key, the metrics key, the matchmaking keys ``..._grad_averager.0b`` and
``..._state_averager.0b``), with N peers, R = ``num_replicas`` (5) holders, V = min(N - 1, 20)
nodes asked per search and e the bytes of one peer's signed entry:

- **Stores.** Each peer stores its entry to the R holders (progress about once a step, metrics every
  30 s): O(1) a peer. Each holder answers the stores of all N - 1 others: O(N). Once a peer knows 5
  others, it also searches for a key's holders every ``HOLDERS_MEMORY_S``: V requests whose answers
  list nodes, no records. Before ed0023b it searched before every store, and those answers carried
  the key's records.
- **Reads.** A holder reads its own copy (``local_reads.read_record``), as does every peer while it
  knows fewer than 5 others. From 46082cf every other peer asked 2 of the key's holders, found and
  remembered as for its stores, picked at random: 2 requests a read, each answer the key's whole
  dictionary, N entries, and no cache store. That is 2 N e bytes a read, O(N) a peer; the R holders
  share the swarm's reads, 2 / R of them each: O(N^2) bytes each. Now it asks
  ``HOLDERS_PER_READ`` (1) and merges the answer into the earlier ones: N e bytes a read. Before
  46082cf it read with hivemind's ``latest=True``. That search never stops early, so it asks all V
  nodes, and each answer carries the N entries (a node that is not a holder answers from the copy
  it cached when it read): V x N e bytes a read, O(N) a peer past N = 21, O(N^2) below it. hivemind
  then caches the dictionary on one more node (``cache_nearest``): a store of N e bytes to a holder
  per read. The V nodes nearest to the key answer every read, and one holder takes every cache
  store. ``Design.holders_per_read`` is 1 or 2 for the one, 0 for the other.
- **Who serves.** Since 4262333 a peer behind NAT serves nothing (``dht.stop_serving``): the S public
  peers are the DHT. A peer behind NAT asks as any other, but its searches visit min(S, 20) nodes, it
  always searches for a key's holders (every ``HOLDERS_MEMORY_S``) and reads from them, and nobody
  asks it anything. The swarm's requests stay the same once S > 20; the S serving peers answer them
  all. ``Design.serving_share`` is S / N (the projection takes ``PUBLIC_SHARE``); None: every peer.
- **Matchmaking.** Each round, each peer runs a few searches of each matchmaking key (hivemind's
  declare and ``get_averagers``): V requests each, answers listing min(N - 2, 20) nodes and every
  leader's declaration (the public peers: O(N) bytes). The requests grow until N = 21, then stay; the
  nodes nearest to a matchmaking key answer all N peers: O(N) requests of O(N) bytes. Since
  ``install_matchmaking`` a fetch is a read from one holder and a declaration goes straight to the
  holders, as for the records (``Design.group_keys_from_holders``); the answers still carry every
  leader's declaration, since the whole swarm averages under one key.

What the request log prints below each peer's top rows (0.5-1.4 KB/s a peer at N = 8) is not added:
it is mostly these same keys' smaller rows, which the model counts already.

A search asks V nodes, not O(log N) of them: the beam of hivemind's searches is a bucket (20), and
running hivemind's own ``traverse_dht`` over k-bucket routing tables (``simulated_searches``) asks
exactly the V nearest up to N = 1,000. Rates come from the code: reads from hivemind's refresh
schedule with p2ptrain's periods, plus the swarm view every 15 s; metrics stores every 30 s. The
progress stores per epoch, the matchmaking searches per round and the record sizes are fitted to the
request log of the 8-peer run after ed0023b (``scale_2026-11-27_n8_requests_after.txt``, and its row
in ``scale_2026-11-27_stores.jsonl`` for the epochs), whose reads were still hivemind's search. Every
measured row predates 46082cf, and each is checked against the design of its own commit, store path
and read path (``MEASURED``). The projection keeps that run's epochs (17 s, as the scale lab's target
batch grows with N): whatever follows rounds scales with their rate.

    nice -n 19 .venv/bin/python benchmarks/scale_model.py --json benchmarks/scale_model_<date>.jsonl
    .venv/bin/python benchmarks/scale_model.py --report benchmarks/scale_model_<date>.jsonl

``--json`` appends one row: the inputs named, the fitted constants, the check against each measured
row, the projection and the first N past each bar, with the commit, date, machine and load
(``run_facts.py``). ``--report`` renders RESULTS.md's tables from the file's last row.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
import functools
import inspect
import json
import math
import random
import re
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from hivemind.dht.node import DHTNode  # noqa: E402
from hivemind.dht.routing import DHTID, RoutingTable  # noqa: E402
from hivemind.dht.traverse import traverse_dht  # noqa: E402
from hivemind.optim.progress_tracker import ProgressTracker  # noqa: E402
from hivemind.dht.validation import DHTRecord  # noqa: E402
from hivemind.p2p import PeerID  # noqa: E402
from hivemind.proto import dht_pb2  # noqa: E402
from hivemind.utils import MSGPackSerializer  # noqa: E402
from hivemind.utils.crypto import RSAPrivateKey  # noqa: E402

from p2ptrain.peers.net.identity import Ed25519PrivateKey, OwnerSignatureValidator, peer_id_of_public_key  # noqa: E402
from p2ptrain.peers.net.local_reads import HOLDERS_MEMORY_S, HOLDERS_PER_READ  # noqa: E402
from p2ptrain.peers.net.traffic import kind_of_key  # noqa: E402
from p2ptrain.peers.training.progress import MAX_REFRESH_PERIOD_S, MIN_REFRESH_PERIOD_S, REPORT_PERIOD_S  # noqa: E402
from p2ptrain.peers.swarm import progress_shards  # noqa: E402
from p2ptrain.peers.swarm.view import RECENT_READ_S  # noqa: E402
from p2ptrain.peers.worker.training_worker import METRICS_INTERVAL_S, SWARM_REPORT_INTERVAL_S  # noqa: E402
from run_facts import facts  # noqa: E402

_NODE = inspect.signature(DHTNode.create).parameters
BUCKET_SIZE = _NODE["bucket_size"].default  # k; also the beam of every search
NUM_REPLICAS = _NODE["num_replicas"].default  # holders of a key
NUM_WORKERS = _NODE["num_workers"].default  # concurrent requests of one search
_TRACKER = inspect.signature(ProgressTracker.__init__).parameters
DRIFT_PEERS = _TRACKER["expected_drift_peers"].default
DRIFT_RATE = _TRACKER["expected_drift_rate"].default
# hivemind's reporter stores progress at least every metadata_expiration / 2, training or not
PROGRESS_STORE_FLOOR_S = _TRACKER["metadata_expiration"].default / 2
PEER_ID_BYTES = 34  # a libp2p peer id of an RSA key (sha2-256 multihash), as p2ptrain's identities are

REQUEST_LOG = "scale_2026-11-27_n8_requests_after.txt"
# the request-logged 8-peer run after ed0023b; its reads were hivemind's search (its design: ``MEASURED``)
FIT_ROW = ("scale_2026-11-27_stores.jsonl", 8, "6d2e971")
METERED = ("progress", "metrics", "matchmaking", "dht")  # the meter's kinds this model covers
PROJECTED = (16, 32, 100, 1000)
SIMULATED = (8, 16, 32, 100, 1000)  # swarm sizes whose searches are run through hivemind's traverse_dht
MEAN_BAR, WORST_BAR = 10_000.0, 20_000.0  # issue 25: background bytes/s per peer, mean and worst
BOUNDED_READ_ENTRIES = 32
# the fit run's averagers that declare themselves in the group keys: its one public peer (the peers behind NAT
# average as clients, which never lead); a projection's are its public peers (``leading_peers``)
FIT_LEADERS = 1
DECLARATIONS_PER_ROUND = 2  # a leader's declaration in a group key a round, and its withdrawal (hivemind's key manager)
RECORD_KINDS = ("progress", "metrics")


@dataclasses.dataclass(frozen=True)
class Design:
    """How records are stored and read.

    Args:
        name: as the tables show it.
        search_before_store: every store searches for the key's holders first, the search answered
            with the key's records (the code before ed0023b).
        paced_stores: progress is stored once per ``REPORT_PERIOD_S`` and at each new epoch, not about
            once a step.
        holders_per_read: a peer that holds no copy asks this many of the key's holders, picked at
            random (remembered as for its stores): one request each, each answer the key's records, and no
            cache store (``local_reads.HOLDERS_PER_READ``, since 46082cf; at random since 49d1673). 0: hivemind's ``latest=True``
            search, which asks every node among the V nearest and then stores the value on one more
            (``cache_nearest``), as before 46082cf.
        read_entries: a read returns at most this many entries (an aggregate or a sample of the
            records) instead of all N; None: all N.
        serving_share: the share of peers that serve the DHT (the public ones: a peer behind NAT serves
            nothing since 4262333, ``dht.stop_serving``); the others only ask, always through the key's
            holders found by a search. None: every peer serves, as before.
        view_remembers: the swarm view (every 15 s) takes what a holder answered in the last
            ``view.RECENT_READ_S``: no read of progress of its own (the tracker's keep it fresh), metrics
            read every 30 s. False: it reads both every 15 s, as before.
        ed25519_records: records are signed with the peers' Ed25519 identities (since 375d8aa): each
            entry and store is :func:`ed25519_saving` bytes smaller. False: RSA-2048, as the fit's run.
        shard_records: progress records in shards of at most this many (``progress_shards``, since 49c1b31):
            S keys, each stored to and read by N / S peers, and a summaries key that 2 peers a shard store to
            and every peer reads with its shard (:func:`progress_keys`). None: one key, as before.
        metrics_in_shards: the metrics records in the progress records' shards too (each peer's record and the
            swarm view's reads in its shard; no summaries). False: one key.
        group_keys_from_holders: the averagers read and declare in their group keys through ``local_reads``
            (``matchmaking.install_matchmaking``): a fetch asks one holder, a declaration goes straight to the
            holders (:func:`matchmaking_key`). False: hivemind's searches.
        summaries_read_s: a peer in shards reads the summaries at most this often (its shard at every read;
            ``progress_shards.SUMMARIES_READ_SHARE`` of a record's lifetime, 10 s). None: at every read,
            as from 49c1b31 to d6d5eb6.
        donors_from_holders: the averagers declare themselves as state donors straight to the donors key's holders
            (``RobustAverager._declare_for_download_periodically``, :func:`donors_key`). False: hivemind's
            search before each declaration.
        shards_per_summary_key: the summaries of this many shards share a key, every peer reading each: S / 8
            keys (not built: the model finds it costs more than it saves). None: one key.
        group_size: the swarm averages in groups of about this many (hivemind's group bits: not built),
            each group's leaders declared under a key of its own, so a peer reads and declares in 1 of
            N / G keys, each holding N / G of the leaders (``in_shards``). None: one group, one key.
    """

    name: str
    search_before_store: bool = False
    paced_stores: bool = False
    holders_per_read: int = 0
    read_entries: int | None = None
    serving_share: float | None = None
    view_remembers: bool = False
    ed25519_records: bool = False
    shard_records: int | None = None
    metrics_in_shards: bool = False
    group_keys_from_holders: bool = False
    summaries_read_s: float | None = None
    donors_from_holders: bool = False
    shards_per_summary_key: int | None = None
    group_size: int | None = None

    def servers(self, peers: int) -> int:
        """How many of ``peers`` serve the DHT."""
        return peers if self.serving_share is None else max(1, min(peers, round(self.serving_share * peers)))

    def store_path(self) -> str:
        """How a store reaches the holders, as the check table says it."""
        if self.search_before_store:
            return "a search before each store (before ed0023b)"
        return ("progress every 10 s, " if self.paced_stores else "") + "to the holders remembered 30 s"

    def read_path(self) -> str:
        """How a peer that holds no copy reads, as the check table says it."""
        if not self.holders_per_read:
            return "hivemind's search (before 46082cf)"
        entries = f", at most {self.read_entries} entries" if self.read_entries else ""
        merged = " and the earlier answers" if self.holders_per_read == 1 else ""
        serving = f"; {self.serving_share:.0%} of the peers serve" if self.serving_share is not None else ""
        return f"{self.holders_per_read} of the holders{merged}{entries}{serving}"


PUBLIC_SHARE = 0.25  # peers with a public address in the projection (2 of 8 in the scale lab's churn runs)
VIEW_REMEMBERS = Design("+ the swarm view reads no more than the tracker keeps fresh (27ce1ff)",
                        holders_per_read=HOLDERS_PER_READ, serving_share=PUBLIC_SHARE, view_remembers=True)
# the last design with every progress record under one key (the tests of the one key's growth use it)
NOW = Design("+ records signed with Ed25519 keys (375d8aa)", holders_per_read=HOLDERS_PER_READ,
             serving_share=PUBLIC_SHARE, view_remembers=True, ed25519_records=True)
SHARDED = dataclasses.replace(NOW, name=f"+ progress in shards of {progress_shards.SHARD_RECORDS} records, "
                              f"{progress_shards.SUMMARIZERS} summaries a shard (49c1b31)", shard_records=progress_shards.SHARD_RECORDS)
METRICS_SHARDED = dataclasses.replace(SHARDED, name="+ metrics records in the same shards (0f3a11d)", metrics_in_shards=True)
GROUP_KEYS = dataclasses.replace(METRICS_SHARDED, name="+ group keys read from their holders (d6d5eb6)", group_keys_from_holders=True)
SUMMARIES_READ_S = _TRACKER["metadata_expiration"].default * progress_shards.SUMMARIES_READ_SHARE
PACED_SUMMARIES = dataclasses.replace(GROUP_KEYS, name=f"+ summaries read every {SUMMARIES_READ_S:.0f} s in shards (d48560b)",
                                      summaries_read_s=SUMMARIES_READ_S)
DONORS = dataclasses.replace(PACED_SUMMARIES, name="+ state donors declared straight to the holders (now)",
                             donors_from_holders=True)
AVERAGING_GROUP = 32  # the group size of the design not built below
SEARCH_READS = Design("holders remembered, reads by hivemind's search (before 46082cf)")
BEFORE = Design("a search before each store (before ed0023b)", search_before_store=True)
TWO_HOLDERS = Design("holders remembered, reads from 2 holders (46082cf to 4262333)", holders_per_read=2)
SERVING_PUBLIC = Design(f"+ peers behind NAT serve nothing, {PUBLIC_SHARE:.0%} public (022d5d1)",
                        holders_per_read=HOLDERS_PER_READ, serving_share=PUBLIC_SHARE)
# two designs not built, for comparison: reads bounded in size, and averaging in groups
BOUNDED_READS = Design(f"+ reads of at most {BOUNDED_READ_ENTRIES} entries", paced_stores=True,
                       holders_per_read=HOLDERS_PER_READ, serving_share=PUBLIC_SHARE, view_remembers=True,
                       ed25519_records=True, read_entries=BOUNDED_READ_ENTRIES)
GROUPS = dataclasses.replace(DONORS, name=f"+ averaging in groups of {AVERAGING_GROUP}, a group key each (not built)",
                             group_size=AVERAGING_GROUP)
SUMMARY_KEYS = dataclasses.replace(GROUPS, name="+ the summaries of 8 shards a key (not built)", shards_per_summary_key=8)
REDESIGNS = (SEARCH_READS, TWO_HOLDERS,
             Design(f"+ reads from {HOLDERS_PER_READ} holder and the earlier answers", holders_per_read=HOLDERS_PER_READ),
             SERVING_PUBLIC, VIEW_REMEMBERS, NOW, SHARDED, METRICS_SHARDED, GROUP_KEYS, PACED_SUMMARIES, DONORS,
             Design("+ progress stored every 10 s", paced_stores=True, holders_per_read=HOLDERS_PER_READ,
                    serving_share=PUBLIC_SHARE, view_remembers=True, ed25519_records=True),
             BOUNDED_READS, GROUPS, SUMMARY_KEYS)
# every measured row: its file, swarm size and commit, and the design of that commit (its store path and read
# path; tests/unit/test_scale_model.py checks them against the commits' history)
MEASURED = (("scale_2026-11-27.jsonl", 2, "b606afe", BEFORE), ("scale_2026-11-27.jsonl", 4, "b606afe", BEFORE),
            ("scale_2026-11-27.jsonl", 8, "7126a1d", BEFORE), ("scale_2026-11-27_stores.jsonl", 8, "fb2631e", BEFORE),
            ("scale_2026-11-27_stores.jsonl", 8, "6d2e971", SEARCH_READS),
            ("scale_2026-11-27_clients.jsonl", 8, "09c314b", TWO_HOLDERS))


@dataclasses.dataclass(frozen=True)
class Activity:
    """How busy the swarm is: an epoch's length in seconds and epochs completed per second."""

    epoch_s: float
    epochs_per_s: float


@dataclasses.dataclass(frozen=True)
class Fitted:
    """The constants fitted to the 8-peer request log (``fit``).

    Args:
        entry_bytes: per record kind, the bytes one peer's signed entry adds to a read's answer.
        store_bytes: per record kind, one ``rpc_store`` of one entry, request and answer.
        progress_stores_per_epoch: progress stores by one peer in one epoch.
        matchmaking_searches_per_epoch: searches of one matchmaking key by one peer in one round.
        matchmaking_value_bytes: what a matchmaking answer carries beyond its list of nodes.
    """

    entry_bytes: dict
    store_bytes: dict
    progress_stores_per_epoch: float
    matchmaking_searches_per_epoch: float
    matchmaking_value_bytes: float


# --- message sizes: hivemind's own protobufs ---------------------------------------------------------

def _node_id() -> bytes:
    return bytes(DHTID.HASH_NBYTES)  # a protobuf's size depends on the id's length only


def find_bytes(neighbours: int) -> int:
    """Bytes of one ``rpc_find`` of one key, request and answer, whose answer lists ``neighbours`` nodes
    and no value."""
    request = dht_pb2.FindRequest(keys=[_node_id()], peer=dht_pb2.NodeInfo(node_id=_node_id()))
    result = dht_pb2.FindResult(nearest_node_ids=[_node_id() for _ in range(neighbours)],
                                nearest_peer_ids=[bytes(PEER_ID_BYTES)] * neighbours)
    answer = dht_pb2.FindResponse(results=[result], peer=dht_pb2.NodeInfo(node_id=_node_id()))
    return request.ByteSize() + answer.ByteSize()


def store_overhead_bytes() -> int:
    """Bytes of one ``rpc_store`` of one empty value, request and answer: what a store adds to the value."""
    request = dht_pb2.StoreRequest(keys=[_node_id()], subkeys=[b""], values=[b""], expiration_time=[1.0],
                                   in_cache=[True], peer=dht_pb2.NodeInfo(node_id=_node_id()))
    answer = dht_pb2.StoreResponse(store_ok=[True], peer=dht_pb2.NodeInfo(node_id=_node_id()))
    return request.ByteSize() + answer.ByteSize()


@functools.cache
def signed_entry_bytes(kind: str | None) -> dict[str, int]:
    """Bytes of one signed entry's subkey and value, by the kind of its owner's key ("rsa": RSA-2048,
    "ed25519": ``identity``'s): its public key, its signature, and for ``kind`` "progress" or "metrics" the
    peer id its record carries (raw bytes in a progress record, base58 in a metrics one); None: an empty value,
    the key and the signature alone."""
    sizes = {}
    for name, key in (("ed25519", Ed25519PrivateKey()), ("rsa", RSAPrivateKey())):
        validator = OwnerSignatureValidator(key)
        peer_id = peer_id_of_public_key(key.get_public_key())
        value = (b"" if kind is None else
                 MSGPackSerializer.dumps(PeerID.from_base58(peer_id).to_bytes() if kind == "progress" else peer_id))
        record = DHTRecord(key=bytes(DHTID.HASH_NBYTES), subkey=MSGPackSerializer.dumps(validator.local_public_key),
                           value=value, expiration_time=1.0)
        sizes[name] = len(record.subkey) + len(validator.sign_value(record))
    return sizes


def ed25519_saving(kind: str) -> int:
    """Bytes one signed entry of ``kind`` (progress or metrics) loses when its owner's key is Ed25519, not
    RSA-2048 (:func:`signed_entry_bytes`)."""
    sizes = signed_entry_bytes(kind)
    return sizes["rsa"] - sizes["ed25519"]


@functools.cache
def summary_extra_bytes() -> int:
    """Bytes a shard's summary takes beyond one progress record (``progress_shards.summarize`` of records on
    one epoch), msgpack-serialized as the DHT stores them; its key and signature are a record's."""
    record = {"peer_id": bytes(PEER_ID_BYTES), "epoch": 1000, "samples_accumulated": 100, "samples_per_second": 1.5,
              "time": 1.7e9, "client_mode": False}
    summary = progress_shards.summarize({b"a": record, b"b": record}, 32, 7, record["peer_id"], 1.7e9)
    return len(MSGPackSerializer.dumps(summary)) - len(MSGPackSerializer.dumps(record))


def neighbours_in_answer(peers: int) -> int:
    """Nodes an answer lists: the answering node's table, less the asker, at most a bucket."""
    return max(0, min(peers - 2, BUCKET_SIZE))


# --- searches: hivemind's traverse_dht over k-bucket routing tables ------------------------------------

def search_visits(peers: int) -> int:
    """Nodes one full search asks (a ``latest=True`` read, or a search for a key's holders): every node
    among the ``bucket_size`` nearest to the key, other than the searcher (``simulated_searches`` checks it)."""
    return min(peers - 1, BUCKET_SIZE)


def simulated_searches(peers: int, searches: int = 10, seed: int = 0) -> list[tuple[int, list[int]]]:
    """Run hivemind's ``traverse_dht`` as ``get(latest=True)`` does, in a swarm of ``peers`` nodes whose
    routing tables hold every other node that their k-buckets have room for.

    Args:
        peers: swarm size.
        searches: searches to run, each from a random node for a random key.
        seed: the node ids, keys, searchers and the order each table learned the others.

    Returns:
        per search, the searcher's rank and the ranks of the nodes it asked, by XOR distance to the key
        (0: the nearest node).
    """
    rng = random.Random(seed)
    nodes = [DHTID.generate(source=f"node {seed} {index}") for index in range(peers)]
    tables: dict[DHTID, RoutingTable] = {}

    def table(node: DHTID) -> RoutingTable:
        if node not in tables:
            tables[node] = RoutingTable(node, BUCKET_SIZE, _NODE["depth_modulo"].default)
            for other in random.Random(f"{seed} {int(node)}").sample(nodes, peers):
                if other != node:
                    tables[node].add_or_update_node(other, int(other))
        return tables[node]

    found = []
    for index in range(searches):
        key, searcher = DHTID.generate(source=f"key {seed} {index}"), rng.choice(nodes)

        async def neighbours(node, queries, key=key, searcher=searcher):
            await asyncio.sleep(0)  # let the other workers start, as network requests would
            return {query: (tuple(n for n, _ in table(node).get_nearest_neighbors(query, BUCKET_SIZE, exclude=searcher)),
                            False) for query in queries}

        start = [n for n, _ in table(searcher).get_nearest_neighbors(key, BUCKET_SIZE, exclude=searcher)]
        _, visited = asyncio.run(traverse_dht([key], start, beam_size=BUCKET_SIZE, num_workers=NUM_WORKERS,
                                              queries_per_call=1, get_neighbors=neighbours,
                                              visited_nodes={key: {searcher}}))
        rank = {node: place for place, node in enumerate(sorted(nodes, key=key.xor_distance))}
        found.append((rank[searcher], sorted(rank[node] for node in visited[key] if node != searcher)))
    return found


# --- rates from the code ----------------------------------------------------------------------------------

def tracker_reads_per_s(peers: int, epoch_s: float, epochs: int = 200) -> float:
    """Reads of the progress key by one peer's ProgressTracker: hivemind's refresh schedule (the estimated
    time to the epoch's end, times N / max(N + 3, 1.2 N), clipped to p2ptrain's 2-30 s), the estimate exact."""
    moment, reads = 0.0, 0
    while moment < epochs * epoch_s:
        to_end = epoch_s - moment % epoch_s
        share = peers / max(peers + DRIFT_PEERS, peers * (1 + DRIFT_RATE))
        moment += min(max(to_end * share, MIN_REFRESH_PERIOD_S), MAX_REFRESH_PERIOD_S)
        reads += 1
    return reads / (epochs * epoch_s)


def reads_per_s(kind: str, peers: int, activity: Activity, design: Design) -> float:
    """Reads of a record key by one peer: the swarm view every ``SWARM_REPORT_INTERVAL_S`` (when it remembers,
    at most every ``RECENT_READ_S`` and none of progress), and for progress the tracker's too."""
    view = 1 / (max(SWARM_REPORT_INTERVAL_S, RECENT_READ_S) if design.view_remembers else SWARM_REPORT_INTERVAL_S)
    if kind == "progress":
        return tracker_reads_per_s(peers, activity.epoch_s) + (0.0 if design.view_remembers else view)
    return view


def stores_per_s(kind: str, fitted: Fitted, activity: Activity, design: Design) -> float:
    """Stores of a record key by one peer."""
    if kind == "metrics":
        return 1 / METRICS_INTERVAL_S
    if design.paced_stores:
        return 1 / REPORT_PERIOD_S + activity.epochs_per_s
    return max(fitted.progress_stores_per_epoch * activity.epochs_per_s, 1 / PROGRESS_STORE_FLOOR_S)


# --- the model ---------------------------------------------------------------------------------------------

class Load:
    """One peer's bytes and requests (made and answered) per second, by kind."""

    def __init__(self):
        self.bytes = dict.fromkeys(("progress", "metrics", "matchmaking"), 0.0)
        self.requests = dict.fromkeys(("progress", "metrics", "matchmaking"), 0.0)

    def add(self, kind: str, requests: float, bytes_each: float) -> None:
        """``requests`` a second of ``bytes_each``, made or answered by this peer."""
        self.requests[kind] += requests
        self.bytes[kind] += requests * bytes_each

    def total(self) -> float:
        """Bytes a second, all kinds."""
        return sum(self.bytes.values())


@dataclasses.dataclass
class KeyTraffic:
    """One key's requests in a swarm, for ``Swarm.add_key``.

    Args:
        kind: the meter's kind.
        ranks: node -> its rank by distance to the key, for the nodes nearest to it (others are farther).
        holder_search: searches a second whose answers carry no value: (by a holder, by another node).
        value_search: searches a second, other than reads, whose answers carry ``value_bytes``: (by a
            holder, by another node).
        value_bytes: what an answer of a value search or a read carries beyond its list of nodes.
        stores: per node, stores a second of one entry, each sent to every holder but itself.
        store_bytes: one such store.
        reads: per node that is no holder, reads a second (a holder reads its own copy).
        read_holders: how a read asks (``Design.holders_per_read``): ``read_holders`` of the key's
            holders at random, one request each; 0: hivemind's search (every node among the ``visits`` nearest),
            then a store of the whole value to the second nearest node (``cache_nearest``; the nearest
            answered first).
        client_searches: per node that serves nothing, searches a second for the key's holders (answers
            without a value); its value searches are ``value_search[1]``.
        client_reads: per node that serves nothing, reads a second, each of ``read_holders`` holders.
    """

    kind: str
    ranks: dict
    holder_search: tuple = (0.0, 0.0)
    value_search: tuple = (0.0, 0.0)
    value_bytes: float = 0.0
    stores: float = 0.0
    store_bytes: float = 0.0
    reads: float = 0.0
    read_holders: int = 0
    client_searches: float = 0.0
    client_reads: float = 0.0

    def value_searches(self) -> tuple:
        """Searches a second whose answers carry ``value_bytes``, reads included: (by a holder, by another node)."""
        if self.read_holders:
            return self.value_search
        return self.value_search[0], self.value_search[1] + self.reads


class Swarm:
    """Every node's load in a swarm of ``peers`` nodes, ``servers`` of which serve the DHT (all: None):
    the serving nodes near some key one by one, the other serving ones as one, the clients as one."""

    def __init__(self, peers: int, servers: int | None = None):
        self.peers, self.servers = peers, servers or peers
        self.clients = self.peers - self.servers
        self.visits = search_visits(self.servers)  # by a serving node
        self.client_visits = min(self.servers, BUCKET_SIZE)  # by a client: it is none of the nodes
        self.answer = find_bytes(neighbours_in_answer(self.servers))
        self.special: dict[int, Load] = {}
        self.anyone = Load()  # a serving node near no key
        self.client = Load()  # a node that serves nothing

    def holders(self) -> int:
        """Nodes that hold a key's records."""
        return min(self.servers, NUM_REPLICAS)

    def is_holder(self, rank: int | None) -> bool:
        """Whether a serving node of this rank reads its own copy: among the nearest, or too few serve."""
        return self.servers - 1 < NUM_REPLICAS or (rank is not None and rank < NUM_REPLICAS)

    def node(self, node: int) -> Load:
        """A node near some key: until now it was like any other (the keys added before were far from it)."""
        if node not in self.special:
            self.special[node] = copy.deepcopy(self.anyone)
        return self.special[node]

    def add_key(self, key: KeyTraffic) -> None:
        """Add the requests one key costs to every node (see ``KeyTraffic``)."""
        for node in set(self.special) | set(key.ranks):
            self.add_to(self.node(node), key, key.ranks.get(node))
        self.add_to(self.anyone, key, None)
        self.add_to_client(key)

    def read_requests(self, key: KeyTraffic) -> list[tuple[int, float]]:
        """(requests, bytes each) of one read by a node that holds no copy (see ``KeyTraffic``)."""
        with_value = self.answer + key.value_bytes
        if key.read_holders:
            return [(min(key.read_holders, self.holders()), with_value)]
        return [(self.visits, with_value), (1, key.value_bytes + store_overhead_bytes())]

    def _searched(self, rates: tuple, rank: int | None) -> float:
        """Searches a second, by the other nodes, that ask a node of ``rank`` (None: far from the key).

        Args:
            rates: searches a second by (a holder, another node); each asks the ``visits`` nodes nearest
                to the key other than itself.
        """
        holders, others = self.holders(), self.servers - self.holders()
        total = holders * rates[0] + others * rates[1]
        if self.servers - 1 <= self.visits or (rank is not None and rank < self.visits):
            return total - rates[0 if self.is_holder(rank) else 1]
        if rank == self.visits:  # asked only by the nodes nearer than itself
            return holders * rates[0] + (self.visits - holders) * rates[1]
        return 0.0

    def add_to(self, load: Load, key: KeyTraffic, rank: int | None) -> None:
        """Add to ``load`` what one key costs a node of ``rank`` (None: far from the key): what it asks, then what it answers."""
        holder, kind = self.is_holder(rank), key.kind
        own, others = (0 if holder else 1), self.servers - self.holders()
        with_value, whole_value = self.answer + key.value_bytes, key.value_bytes + store_overhead_bytes()
        load.add(kind, key.holder_search[own] * self.visits, self.answer)
        load.add(kind, key.value_search[own] * self.visits, with_value)
        load.add(kind, key.stores * (self.holders() - holder), key.store_bytes)
        load.add(kind, self._searched(key.holder_search, rank), self.answer)
        load.add(kind, self._searched(key.value_searches(), rank), with_value)
        if self.servers <= self.client_visits or (rank is not None and rank < self.client_visits):
            load.add(kind, self.clients * key.client_searches, self.answer)  # every client's searches ask it
            load.add(kind, self.clients * key.value_search[1], with_value)
        share = min(key.read_holders, self.holders()) / self.holders()
        if holder:  # every other peer's stores, and its share of the reads: each picks its holders at random
            load.add(kind, key.stores * (self.peers - 1), key.store_bytes)
            if key.read_holders:
                load.add(kind, key.reads * others * share, with_value)
            load.add(kind, key.client_reads * self.clients * share, with_value)
        else:
            for requests, bytes_each in self.read_requests(key):
                load.add(kind, key.reads * requests, bytes_each)
        if rank == 1 and not key.read_holders:  # hivemind's cache store after every read
            load.add(kind, key.reads * others, whole_value)

    def add_to_client(self, key: KeyTraffic) -> None:
        """Add to ``client`` what one key costs a node that serves nothing: only what it asks."""
        with_value = self.answer + key.value_bytes
        self.client.add(key.kind, key.client_searches * self.client_visits, self.answer)
        self.client.add(key.kind, key.value_search[1] * self.client_visits, with_value)
        self.client.add(key.kind, key.stores * self.holders(), key.store_bytes)
        self.client.add(key.kind, key.client_reads * min(key.read_holders, self.holders()), with_value)

    def loads(self) -> tuple[Load, Load, int]:
        """The worst node, the serving node near no key, and how many serving nodes are near no key
        (``client`` is each of the ``clients``)."""
        nodes = list(self.special.values()) + [self.anyone] + ([self.client] if self.clients else [])
        return max(nodes, key=Load.total), self.anyone, self.servers - len(self.special)


def _ranks(peers: int, visits: int, seed: str) -> dict:
    """Random nodes as the ``visits + 1`` nearest to one key, by rank (``peers``: the serving nodes)."""
    chosen = random.Random(seed).sample(range(peers), min(peers, visits + 1))
    return {node: rank for rank, node in enumerate(chosen)}


def record_key(kind: str, swarm: Swarm, fitted: Fitted, activity: Activity, design: Design) -> KeyTraffic:
    """The requests of a record key (progress or metrics) under ``design``."""
    peers, searching = swarm.peers, swarm.servers - 1 >= NUM_REPLICAS
    entries = min(peers, design.read_entries or peers)
    reads, stores = reads_per_s(kind, peers, activity, design), stores_per_s(kind, fitted, activity, design)
    saving = ed25519_saving(kind) if design.ed25519_records else 0
    key = KeyTraffic(kind, _ranks(swarm.servers, swarm.visits, f"{peers} {kind}"), stores=stores,
                     store_bytes=fitted.store_bytes[kind] - saving, value_bytes=entries * (fitted.entry_bytes[kind] - saving))
    if swarm.clients:  # a client searches for the holders and reads from them whatever the swarm's size
        key.client_searches, key.client_reads = 1 / HOLDERS_MEMORY_S, reads
        key.read_holders = design.holders_per_read
    if not searching:
        return key
    if design.search_before_store:
        key.value_search = (stores, stores)
    else:
        key.holder_search = (1 / HOLDERS_MEMORY_S, 1 / HOLDERS_MEMORY_S)
    key.reads, key.read_holders = reads, design.holders_per_read
    return key


def in_shards(whole: KeyTraffic, swarm: Swarm, shards: int) -> list[KeyTraffic]:
    """One key's requests split over ``shards`` keys: each with a 1 / S share of every peer's stores,
    searches and reads (each peer stores to and reads its own shard, or its group's key) and 1 / S of the entries."""
    if shards == 1:
        return [whole]
    return [dataclasses.replace(
        whole, ranks=_ranks(swarm.servers, swarm.visits, f"{swarm.peers} {whole.kind} {shards}.{index}"),
        holder_search=tuple(rate / shards for rate in whole.holder_search), stores=whole.stores / shards,
        value_bytes=whole.value_bytes / shards, reads=whole.reads / shards, client_searches=whole.client_searches / shards,
        client_reads=whole.client_reads / shards) for index in range(shards)]


def progress_keys(swarm: Swarm, fitted: Fitted, activity: Activity, design: Design) -> list[KeyTraffic]:
    """The requests of the progress records' keys: one key (``record_key``), or with ``design.shard_records``
    S shard keys, each with a 1 / S share of every peer's stores, searches and reads (each peer stores to and
    reads its own shard) and N / S entries, and the summaries key: stored by 2 peers a shard at each of their
    reads (at most every ``SUMMARY_PERIOD_S``; every ``LAYOUT_CHECK_S`` in one shard), read by every peer
    with its shard (at most every ``design.summaries_read_s``; every ``LAYOUT_CHECK_S`` in one shard), each
    read 2 S summaries."""
    whole = record_key("progress", swarm, fitted, activity, design)
    if not design.shard_records:
        return [whole]
    peers = swarm.peers
    shards = progress_shards.shards_for(peers, 1, design.shard_records)
    keys = in_shards(whole, swarm, shards)
    summarizers = min(peers, progress_shards.SUMMARIZERS * shards)
    tracker_reads = reads_per_s("progress", peers, activity, design)
    reads = tracker_reads if shards > 1 else 1 / progress_shards.LAYOUT_CHECK_S
    if shards > 1 and design.summaries_read_s:
        reads = min(reads, 1 / design.summaries_read_s)
    summaries_per_s = (min(tracker_reads, 1 / progress_shards.SUMMARY_PERIOD_S) if shards > 1
                       else 1 / progress_shards.LAYOUT_CHECK_S)
    summary_bytes = whole.value_bytes / peers + summary_extra_bytes()
    summary_keys = math.ceil(shards / design.shards_per_summary_key) if design.shards_per_summary_key else 1
    keys += [dataclasses.replace(  # each summaries key read by every peer, stored to by its shards' summarizers
        whole, ranks=_ranks(swarm.servers, swarm.visits, f"{peers} progress summaries {index}" if index else f"{peers} progress summaries"),
        stores=summaries_per_s * summarizers / peers / summary_keys, store_bytes=whole.store_bytes + summary_extra_bytes(),
        value_bytes=summarizers * summary_bytes / summary_keys, reads=reads if whole.reads else 0.0,
        client_reads=reads if whole.client_reads else 0.0) for index in range(summary_keys)]
    return keys


def leading_peers(peers: int) -> int:
    """Averagers in a swarm of ``peers`` that declare themselves in each group key at each round (``PUBLIC_SHARE``
    of them: the peers behind NAT average as clients, which never lead); hivemind keeps each declaration
    (withdrawn or not) in the key's value until it expires, so every answer lists them all."""
    return max(1, round(PUBLIC_SHARE * peers))


def matchmaking_key(name: str, swarm: Swarm, fitted: Fitted, activity: Activity, design: Design) -> KeyTraffic:
    """The requests of one group key: a few fetches a round by every peer and a declaration and its withdrawal
    by each leader, each answer carrying every leader's declaration (``leading_peers``).

    hivemind searches at each fetch and before each declaration (the fitted searches a round count both).
    With ``design.group_keys_from_holders`` a fetch reads as a record key is read (its own copy, or one holder)
    and a declaration goes straight to the holders; each fitted search is taken as a fetch (an upper bound:
    some were a declaration's search), and the declarations are added as stores, averaged over the peers."""
    searches = fitted.matchmaking_searches_per_epoch * activity.epochs_per_s
    leaders = leading_peers(swarm.peers)
    declaration = fitted.matchmaking_value_bytes / FIT_LEADERS
    key = KeyTraffic("matchmaking", _ranks(swarm.servers, swarm.visits, f"{swarm.peers} {name}"),
                     value_bytes=declaration * leaders)
    if not design.group_keys_from_holders:
        key.value_search = (searches, searches)
        return key
    key.stores = DECLARATIONS_PER_ROUND * activity.epochs_per_s * leaders / swarm.peers
    key.store_bytes = store_overhead_bytes() + declaration
    if swarm.clients:  # as ``record_key``: a client reads from the holders whatever the swarm's size
        key.client_searches, key.client_reads, key.read_holders = 1 / HOLDERS_MEMORY_S, searches, HOLDERS_PER_READ
    if swarm.servers - 1 >= NUM_REPLICAS:
        key.holder_search = (1 / HOLDERS_MEMORY_S, 1 / HOLDERS_MEMORY_S)
        key.reads, key.read_holders = searches, HOLDERS_PER_READ
    return key


def donors_key(name: str, swarm: Swarm, fitted: Fitted, activity: Activity, design: Design) -> KeyTraffic:
    """The declarations of one averager's state donors (``<prefix>.all_averagers``): each leader (a public peer;
    clients share no state) declares its priority, its epoch, at each epoch, averaged here over every peer; each
    declaration is a store to the holders, of an entry the size of a group key's (a peer id and a number), and
    every answer carries every donor's declaration. hivemind searches for the holders before each declaration;
    with ``design.donors_from_holders`` a declaring peer searches for them once per ``HOLDERS_MEMORY_S``. Left
    out: the joiners' reads of the key, one a download (a join or a return, not every round)."""
    leaders = leading_peers(swarm.peers)
    entry = fitted.matchmaking_value_bytes / FIT_LEADERS
    declarations = activity.epochs_per_s * leaders / swarm.peers
    key = KeyTraffic("matchmaking", _ranks(swarm.servers, swarm.visits, f"{swarm.peers} {name} donors"),
                     value_bytes=entry * leaders, stores=declarations, store_bytes=store_overhead_bytes() + entry)
    if not design.donors_from_holders:
        key.value_search = (declarations, declarations)
    elif swarm.servers - 1 >= NUM_REPLICAS:
        searches = leaders / swarm.peers / HOLDERS_MEMORY_S
        key.holder_search = (searches, searches)
    return key


def model(peers: int, fitted: Fitted, activity: Activity, design: Design = NOW) -> dict:
    """Mean and worst peer's background in a swarm of ``peers``: bytes/s by kind and in all, requests/min by kind.

    Args:
        peers: swarm size N.
        fitted: the constants ``fit`` found.
        activity: epochs the swarm completes (progress stores and matchmaking follow them).
        design: how records are stored and read.
    """
    swarm = Swarm(peers, design.servers(peers))
    for key in progress_keys(swarm, fitted, activity, design):
        swarm.add_key(key)
    metrics = record_key("metrics", swarm, fitted, activity, design)
    shards = progress_shards.shards_for(peers, 1, design.shard_records) if design.metrics_in_shards else 1
    for key in in_shards(metrics, swarm, shards):
        swarm.add_key(key)
    groups = max(1, round(peers / design.group_size)) if design.group_size else 1
    for name in ("grad", "state"):
        for key in in_shards(matchmaking_key(name, swarm, fitted, activity, design), swarm, groups):
            swarm.add_key(key)
        swarm.add_key(donors_key(name, swarm, fitted, activity, design))
    worst, anyone, plain = swarm.loads()
    loads = list(swarm.special.values())

    def summary(kinds_of) -> dict:
        return {kind: (sum(kinds_of(load)[kind] for load in loads) + plain * kinds_of(anyone)[kind]
                       + swarm.clients * kinds_of(swarm.client)[kind]) / peers
                for kind in kinds_of(anyone)}

    def described(load_bytes: dict, load_requests: dict) -> dict:
        return {"bytes_per_s": sum(load_bytes.values()), "by_kind": load_bytes,
                "requests_per_min": {kind: 60 * rate for kind, rate in load_requests.items()}}

    return {"peers": peers, "design": design.name,
            "mean": described(summary(lambda load: load.bytes), summary(lambda load: load.requests)),
            "worst": described(worst.bytes, worst.requests)}


# --- fitting to the request log ----------------------------------------------------------------------------

_PEER = re.compile(r"^(\S+): [\d.]+ KB/s in all$")
_ROW = re.compile(r"^\s*([\d.]+)\s+([\d.]+)\s+(call|serve|stream)\s+(\S+)\s+(\S+)[ ]?(\S*)$")
_READ = re.compile(r"^\s+([\d.]+)\s+read\s+(\S+): (.*)$")


def read_request_counts(path: Path) -> dict:
    """``request_counts.py``'s printout: per peer, ``rows`` (bytes/s, requests/s, direction, kind, handler,
    key) and ``reads`` (reads/s, key, how it was answered)."""
    peers, peer = {}, None
    for line in path.read_text().splitlines():
        if match := _PEER.match(line):
            peer = peers[match[1]] = {"rows": [], "reads": []}
        elif peer is not None and (match := _ROW.match(line)):
            peer["rows"].append((1000 * float(match[1]), float(match[2]), match[3], match[4], match[5], match[6]))
        elif peer is not None and (match := _READ.match(line)):
            peer["reads"].append((float(match[1]), match[2], match[3]))
    return peers


def keys_of(counts: dict, kind: str) -> list[str]:
    """The keys of ``kind`` (``traffic.kind_of_key``) that the log names."""
    return sorted({row[5] for peer in counts.values() for row in peer["rows"] if row[5] and kind_of_key(row[5]) == kind})


def row_of(peer: dict, direction: str, handler: str, key: str) -> tuple[float, float] | None:
    """(bytes/s, requests/s) of one printed row, None when the printout left it out."""
    for rate, requests, row_direction, _, row_handler, row_key in peer["rows"]:
        if (row_direction, row_handler, row_key) == (direction, f"DHTProtocol.{handler}", key):
            return rate, requests
    return None


def network_reads(peer: dict, key: str) -> float:
    return sum(rate for rate, read_key, how in peer["reads"] if read_key == key and how.startswith("network"))


def is_holder(peer: dict, key: str) -> bool:
    """Whether the peer read ``key`` mostly from its own copy."""
    local = sum(rate for rate, read_key, how in peer["reads"] if read_key == key and how == "local")
    return local > network_reads(peer, key)


def entry_bytes(counts: dict, key: str, peers: int) -> float:
    """Bytes one peer's entry adds to an answer: over the peers that read ``key`` from the network, their
    ``rpc_find`` bytes less the node lists, over the answers that carried the key (all but the holder searches)."""
    answer, sizes = find_bytes(neighbours_in_answer(peers)), []
    for peer in counts.values():
        found = row_of(peer, "call", "rpc_find", key)
        if found and not is_holder(peer, key):
            rate, requests = found
            with_value = requests - search_visits(peers) / HOLDERS_MEMORY_S
            sizes.append((rate - requests * answer) / with_value / peers)
    return statistics.fmean(sizes)


def store_bytes(counts: dict, key: str) -> float:
    """One store of one entry: the median bytes per ``rpc_store`` that the key's holders answered (the median
    leaves out the one that also took hivemind's cache stores of the whole dictionary)."""
    sizes = [rate / requests for peer in counts.values() if is_holder(peer, key)
             for rate, requests in [row_of(peer, "serve", "rpc_store", key) or (0.0, 0.0)] if requests]
    return statistics.median(sizes)


def progress_stores_per_epoch(counts: dict, key: str, row: dict) -> float:
    """Progress stores by one peer in one epoch: the stores the holders answered (less the cache stores, one
    per network read), over the holders' count times the N - 1 peers that store to each, per epoch."""
    peers = row["peers"]
    answered = sum((row_of(peer, "serve", "rpc_store", key) or (0.0, 0.0))[1] for peer in counts.values() if is_holder(peer, key))
    cached = sum(network_reads(peer, key) for peer in counts.values())
    per_second = (answered - cached) / (min(peers, NUM_REPLICAS) * (peers - 1))
    return per_second * row["train_s"] / row["epochs"]


def matchmaking_searches(counts: dict, row: dict) -> tuple[float, float]:
    """(searches of one matchmaking key by one peer per round, bytes an answer carries beyond its node list),
    over the peers whose printout lists the key's ``rpc_find`` row."""
    peers, rows = row["peers"], []
    for key in keys_of(counts, "matchmaking"):
        rows += [found for peer in counts.values() if (found := row_of(peer, "call", "rpc_find", key))]
    requests = statistics.fmean(found[1] for found in rows)
    bytes_each = sum(found[0] for found in rows) / sum(found[1] for found in rows)
    return requests / search_visits(peers) * row["train_s"] / row["epochs"], bytes_each - find_bytes(neighbours_in_answer(peers))


def fit(counts: dict, row: dict) -> Fitted:
    """The model's constants from the request log ``counts`` of the run measured in ``row``."""
    peers = row["peers"]
    progress, metrics = keys_of(counts, "progress")[0], keys_of(counts, "metrics")[0]
    searches, value = matchmaking_searches(counts, row)
    return Fitted(entry_bytes={"progress": entry_bytes(counts, progress, peers), "metrics": entry_bytes(counts, metrics, peers)},
                  store_bytes={"progress": store_bytes(counts, progress), "metrics": store_bytes(counts, metrics)},
                  progress_stores_per_epoch=progress_stores_per_epoch(counts, progress, row),
                  matchmaking_searches_per_epoch=searches, matchmaking_value_bytes=value)


# --- measured rows, the check and the projection -------------------------------------------------------------

def measured_row(file: str, peers: int, commit: str) -> dict:
    """The row of a scale lab data file (beside this script) of ``peers`` whose commit starts with ``commit``."""
    rows = [json.loads(line) for line in (HERE / file).read_text().splitlines() if line.strip()]
    return next(row for row in rows if row["peers"] == peers and row["commit"].startswith(commit))


def activity_of(row: dict) -> Activity:
    """The swarm's epochs in a measured row."""
    return Activity(epoch_s=row["epoch_duration_s"]["mean"], epochs_per_s=row["epochs"] / row["train_s"])


def metered_background(row: dict) -> dict:
    """Mean and worst over a row's peers of what their meters counted on the DHT (``METERED``), and the
    mean of the rest (``other``: libp2p's own bytes, relaying), bytes/s."""
    peers = [sum(kinds[kind] for kind in METERED) for kinds in row["meter_bytes_per_s"].values()]
    other = [kinds["other"] for kinds in row["meter_bytes_per_s"].values()]
    return {"mean": statistics.fmean(peers), "worst": max(peers), "other_mean": statistics.fmean(other)}


def measured_design(file: str, peers: int, commit: str) -> Design:
    """The design of a measured row's commit (``MEASURED``)."""
    return next(row[3] for row in MEASURED if row[:3] == (file, peers, commit))


def check(fitted: Fitted) -> list[dict]:
    """The model against every measured row (``MEASURED``), each with its own epochs, store path and read path."""
    checks = []
    for file, peers, commit, design in MEASURED:
        row = measured_row(file, peers, commit)
        modelled = model(row["peers"], fitted, activity_of(row), design)
        measured = metered_background(row)
        if peers - 1 >= NUM_REPLICAS:
            paths = {"store_path": design.store_path(), "read_path": design.read_path()}
        else:
            paths = {"store_path": "straight to every peer (under 6 peers)", "read_path": "its own copy (under 6 peers)"}
        checks.append({"file": file, "commit": row["commit"][:7], "peers": peers, "design": design.name, **paths,
                       "epochs": row["epochs"], "train_s": row["train_s"], "measured": measured,
                       "model": {"mean": modelled["mean"]["bytes_per_s"], "worst": modelled["worst"]["bytes_per_s"]}})
    return checks


def logged_requests_per_min(counts: dict) -> dict:
    """Mean over the peers of the request log's requests a minute, made and answered, by kind (its top rows only)."""
    kinds = dict.fromkeys(("progress", "metrics", "matchmaking"), 0.0)
    for peer in counts.values():
        for _, requests, direction, _, _, key in peer["rows"]:
            if direction in ("call", "serve") and kind_of_key(key) in kinds:
                kinds[kind_of_key(key)] += 60 * requests / len(counts)
    return kinds


def first_past_bars(fitted: Fitted, activity: Activity, design: Design, largest: int = 100_000) -> dict:
    """The smallest N whose mean peer passes ``MEAN_BAR`` and whose worst peer passes ``WORST_BAR``
    (every N up to 200, then every 1 %), None when none up to ``largest``."""
    sizes = list(range(2, 201))
    while sizes[-1] < largest:
        sizes.append(math.ceil(sizes[-1] * 1.01))
    found = {"mean": None, "worst": None}
    for peers in sizes:
        modelled = model(peers, fitted, activity, design)
        for side, bar in (("mean", MEAN_BAR), ("worst", WORST_BAR)):
            if found[side] is None and modelled[side]["bytes_per_s"] > bar:
                found[side] = peers
        if None not in found.values():
            break
    return found


def projection(fitted: Fitted, activity: Activity) -> list[dict]:
    """Every redesign at N = 8 and ``PROJECTED``, with the first N past each bar."""
    return [{"design": design.name, "rows": [model(peers, fitted, activity, design) for peers in (8, *PROJECTED)],
             "first_past_bars": first_past_bars(fitted, activity, design)} for design in REDESIGNS]


def simulation() -> dict:
    """Nodes asked per search, by swarm size, from hivemind's traverse_dht (``simulated_searches``), and
    whether they were always the nearest to the key (the law ``search_visits`` uses)."""
    found = {}
    for peers in SIMULATED:
        searches = simulated_searches(peers)
        nearest = all(ranks == [rank for rank in range(search_visits(peers) + 1) if rank != searcher][:len(ranks)]
                      for searcher, ranks in searches)
        found[str(peers)] = {"asked_mean": statistics.fmean(len(ranks) for _, ranks in searches),
                             "law": search_visits(peers), "always_the_nearest": nearest}
    return found


def run() -> dict:
    """The data file's row: inputs, fitted constants, simulation, check and projection."""
    fit_row = measured_row(*FIT_ROW)
    counts = read_request_counts(HERE / REQUEST_LOG)
    fitted, activity = fit(counts, fit_row), activity_of(fit_row)
    fit_design = measured_design(*FIT_ROW)
    return {"benchmark": "scale_model", **facts(),
            "inputs": {"request_log": REQUEST_LOG, "fit_row": dict(zip(("file", "peers", "commit"), FIT_ROW)),
                       "measured": [{"file": file, "peers": peers, "commit": commit, "design": design.name,
                                     "store_path": design.store_path(), "read_path": design.read_path()}
                                    for file, peers, commit, design in MEASURED],
                       "activity": dataclasses.asdict(activity)},
            "protocol": {"signed_entry_bytes": {str(kind): signed_entry_bytes(kind) for kind in (None, *RECORD_KINDS)},
                         "bucket_size": BUCKET_SIZE, "num_replicas": NUM_REPLICAS, "holders_memory_s": HOLDERS_MEMORY_S,
                         "holders_per_read": HOLDERS_PER_READ,
                         "report_period_s": REPORT_PERIOD_S, "metrics_interval_s": METRICS_INTERVAL_S,
                         "swarm_report_interval_s": SWARM_REPORT_INTERVAL_S,
                         "refresh_period_s": [MIN_REFRESH_PERIOD_S, MAX_REFRESH_PERIOD_S],
                         "find_bytes_by_neighbours": {str(n): find_bytes(n) for n in (0, 6, BUCKET_SIZE)}},
            "fitted": dataclasses.asdict(fitted), "simulated_searches": simulation(),
            "check": check(fitted), "projection": projection(fitted, activity),
            "check_requests_per_min": {"request_log": logged_requests_per_min(counts), "design": fit_design.name,
                                       "model": model(fit_row["peers"], fitted, activity, fit_design)["mean"]["requests_per_min"]}}


# --- the tables -------------------------------------------------------------------------------------------------

def _kb(value: float) -> str:
    return f"{value / 1000:,.1f}"


def _error(model_value: float, measured: float) -> str:
    return f"{model_value / measured - 1:+.0%}"


def check_table(row: dict) -> list[str]:
    """The model against the measured rows."""
    lines = ["| peers | measured row | store path | read path (no copy held) | epochs in the window | measured KB/s, mean / worst | "
             "model KB/s, mean / worst | model ÷ measured − 1, mean / worst | measured `other` KB/s, mean (not modelled) |",
             "|---:|---|---|---|---:|---:|---:|---:|---:|"]
    for found in row["check"]:
        measured, modelled = found["measured"], found["model"]
        lines.append(f"| {found['peers']} | {found['file']} {found['commit']} | {found['store_path']} | {found['read_path']} | "
                     f"{found['epochs']} in {found['train_s']:.0f} s | {_kb(measured['mean'])} / {_kb(measured['worst'])} | "
                     f"{_kb(modelled['mean'])} / {_kb(modelled['worst'])} | "
                     f"{_error(modelled['mean'], measured['mean'])} / {_error(modelled['worst'], measured['worst'])} | "
                     f"{_kb(measured['other_mean'])} |")
    return lines


def requests_table(row: dict) -> list[str]:
    """Requests a minute of the mean peer at N = 8: the request log's top rows against the model."""
    found = row["check_requests_per_min"]
    lines = ["| requests/min per peer, N = 8 (6d2e971), mean | progress | metrics | matchmaking |", "|---|---:|---:|---:|"]
    model_label = f"model ({found['design'].split(' (')[0]})"
    for name, label in (("request_log", "request log (its top 12 rows a peer)"), ("model", model_label)):
        lines.append(f"| {label} | " + " | ".join(f"{value:,.0f}" for value in found[name].values()) + " |")
    return lines


def projection_table(row: dict) -> list[str]:
    """The code as it is, by N: bytes and requests of the mean and the worst peer, by kind."""
    now = next(design for design in row["projection"] if design["design"].endswith("(now)"))
    epoch_s = row["inputs"]["activity"]["epoch_s"]
    lines = [f"The code as it is ({now['design'].split(' (')[0]}), each peer's epochs as in the 8-peer run ({epoch_s:.0f} s):", "",
             "| peers | KB/s, mean / worst | mean KB/s: progress / metrics / matchmaking | "
             "worst KB/s: progress / metrics / matchmaking | requests/min, mean: progress / metrics / matchmaking | "
             "requests/min, worst: progress / metrics / matchmaking |",
             "|---:|---:|---:|---:|---:|---:|"]
    for modelled in now["rows"]:
        mean, worst = modelled["mean"], modelled["worst"]
        lines.append(f"| {modelled['peers']:,} | {_kb(mean['bytes_per_s'])} / {_kb(worst['bytes_per_s'])} | "
                     + " / ".join(_kb(value) for value in mean["by_kind"].values()) + " | "
                     + " / ".join(_kb(value) for value in worst["by_kind"].values()) + " | "
                     + " / ".join(f"{value:,.0f}" for value in mean["requests_per_min"].values()) + " | "
                     + " / ".join(f"{value:,.0f}" for value in worst["requests_per_min"].values()) + " |")
    return lines


def redesign_table(row: dict) -> list[str]:
    """Each redesign: mean / worst KB/s by N, and the first N past each bar."""
    sizes = [modelled["peers"] for modelled in row["projection"][0]["rows"]]
    lines = ["| design | " + " | ".join(f"N = {peers:,}, mean / worst KB/s" for peers in sizes)
             + f" | first N past {MEAN_BAR / 1000:.0f} KB/s mean | first N past {WORST_BAR / 1000:.0f} KB/s worst |",
             "|---|" + "---:|" * (len(sizes) + 2)]
    for design in row["projection"]:
        past = design["first_past_bars"]
        lines.append(f"| {design['design']} | "
                     + " | ".join(f"{_kb(m['mean']['bytes_per_s'])} / {_kb(m['worst']['bytes_per_s'])}" for m in design["rows"])
                     + " | " + " | ".join(f"{past[side]:,}" if past[side] else "none" for side in ("mean", "worst")) + " |")
    return lines


def tables(row: dict) -> str:
    """The fitted constants in a line, then the check, the projection and the redesigns."""
    fitted = row["fitted"]
    header = (f"Model at commit {row['commit'][:7]}, {row['date'][:10]}; fitted to {row['inputs']['request_log']}: "
              f"an entry {fitted['entry_bytes']['progress']:.0f} B (progress) and {fitted['entry_bytes']['metrics']:.0f} B "
              f"(metrics), a store {fitted['store_bytes']['progress']:.0f} B and {fitted['store_bytes']['metrics']:.0f} B, "
              f"{fitted['progress_stores_per_epoch']:.1f} progress stores and {fitted['matchmaking_searches_per_epoch']:.1f} "
              f"searches of each matchmaking key per peer per epoch")
    signed = row["protocol"].get("signed_entry_bytes")
    if signed:  # rows since the Ed25519 design
        header += (f". A signed entry's key and signature: {signed['None']['rsa']} B with an RSA-2048 key, "
                   f"{signed['None']['ed25519']} B with an Ed25519 one; with its peer id, "
                   + ", ".join(f"{kind} {signed[kind]['rsa']} and {signed[kind]['ed25519']} B" for kind in RECORD_KINDS))
    return "\n".join([header, "", *check_table(row), "", *requests_table(row), "", *projection_table(row), "",
                      *redesign_table(row)])


def report(path: Path) -> str:
    """RESULTS.md's tables of the last row of a ``--json`` file."""
    return tables([json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()][-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="append the model's row (inputs, constants, check, projection) here")
    parser.add_argument("--report", type=Path, help="print RESULTS.md's tables of a --json file's last row and exit")
    options = parser.parse_args()
    if options.report:
        print(report(options.report))
        return 0
    row = run()
    if options.json:
        with options.json.open("a") as file:
            file.write(json.dumps(row) + "\n")
    print(tables(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
