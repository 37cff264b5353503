"""The swarm's records read from a peer's own copy: counted with p2ptrain's traffic meter
between real hivemind DHT peers on 127.0.0.1 (``tests/metered_peers.py``).
"""

import functools

import pytest
from hivemind.utils import get_dht_time

from metered_peers import loopback_dhts, sent_and_received
from p2ptrain.peers.net.local_reads import FULL_COPY_AFTER_S, HOLDERS_MEMORY_S, read_record, store_record
from p2ptrain.peers.net.dht import own_public_key
from p2ptrain.peers.swarm.records import METRICS_EXPIRATION_S, LocalMetrics, metrics_key
from p2ptrain.peers.swarm.run_records import publish_metrics, read_metrics

pytestmark = pytest.mark.swarm


@pytest.fixture
def three_peers(tmp_path, meter):
    with loopback_dhts(tmp_path, 3) as peers:
        yield peers


def a_minute_in_the_swarm(dht):
    """What ``local_reads`` trusts after a minute: moved back, not waited for."""
    dht.p2ptrain_started -= FULL_COPY_AFTER_S + 1


@pytest.mark.timeout(120)
def test_after_a_minute_a_peer_reads_every_record_from_its_own_copy_without_asking(three_peers, meter):
    for index, dht in enumerate(three_peers):
        record = LocalMetrics(peer_id=dht.peer_id.to_base58(), nickname=f"peer{index}", time=get_dht_time())
        assert publish_metrics(dht, "local-run", record)
    reader = three_peers[2]

    # a peer that has just joined asks the others: its storage may miss what was stored before it came
    before = sent_and_received(meter, "metrics")
    assert sorted(row.nickname for row in read_metrics(reader, "local-run")) == ["peer0", "peer1", "peer2"]
    asked = sent_and_received(meter, "metrics") - before
    assert asked > 0

    a_minute_in_the_swarm(reader)
    before = sent_and_received(meter, "metrics")
    for _ in range(5):
        assert sorted(row.nickname for row in read_metrics(reader, "local-run")) == ["peer0", "peer1", "peer2"]
    assert sent_and_received(meter, "metrics") - before == 0

    # a newer record reaches the reader's copy when it is stored
    newer = LocalMetrics(peer_id=three_peers[0].peer_id.to_base58(), nickname="renamed", time=get_dht_time())
    assert publish_metrics(three_peers[0], "local-run", newer)
    assert "renamed" in [row.nickname for row in read_metrics(reader, "local-run")]


@pytest.mark.timeout(120)
def test_a_record_goes_straight_to_every_peer_without_searching_for_them(three_peers, meter):
    for index, dht in enumerate(three_peers):  # every peer's record first: a search's answers carry them all
        record = LocalMetrics(peer_id=dht.peer_id.to_base58(), nickname=f"peer{index}", time=get_dht_time())
        assert publish_metrics(dht, "local-run", record)
    writer = three_peers[0]
    newer = LocalMetrics(peer_id=writer.peer_id.to_base58(), nickname="renamed", time=get_dht_time())

    before = sent_and_received(meter, "metrics")
    assert publish_metrics(writer, "local-run", newer)
    direct = sent_and_received(meter, "metrics") - before
    for dht in three_peers:  # it reached every peer's own copy
        a_minute_in_the_swarm(dht)
        assert "renamed" in [row.nickname for row in read_metrics(dht, "local-run")]

    # hivemind's store of the same record: a search for the holders first
    before = sent_and_received(meter, "metrics")
    assert writer.store(metrics_key("local-run"), subkey=own_public_key(writer), value=newer.model_dump(mode="json"),
                        expiration_time=get_dht_time() + METRICS_EXPIRATION_S + 60)  # outlives the last one
    searched = sent_and_received(meter, "metrics") - before
    print(f"one record stored to 2 peers: {direct:.0f} B straight, {searched:.0f} B with hivemind's search")
    assert 0 < direct < searched / 2


async def _count_searches(dht, node):
    """Run in a DHT process: count its ``rpc_find`` calls from now on (``_searches`` reads the count)."""
    calls, call_find = [0], node.protocol.call_find

    async def counted(*args, **kwargs):
        calls[0] += 1
        return await call_find(*args, **kwargs)

    node.protocol.call_find, node.p2ptrain_test_finds = counted, calls


async def _searches(dht, node) -> int:
    return node.p2ptrain_test_finds[0]


async def _expire_holders(dht, node):
    """Run in a DHT process: what ``local_reads`` remembers of every key's holders, made older than
    ``HOLDERS_MEMORY_S`` (moved back, not waited for)."""
    node.p2ptrain_holders = {key_id: (until - HOLDERS_MEMORY_S, found)
                             for key_id, (until, found) in node.p2ptrain_holders.items()}


async def _node_facts(dht, node):
    """Run in a DHT process: its node id, how many nodes its routing table knows, its num_replicas."""
    return int(node.node_id), len(node.protocol.routing_table.uid_to_peer_id), node.num_replicas


@pytest.mark.timeout(240)
def test_past_five_peers_stores_search_for_the_holders_once_and_still_reach_them(tmp_path, meter):
    from hivemind.dht.routing import DHTID

    key, stores = "local-run_progress", 30
    with loopback_dhts(tmp_path, 8) as peers:
        nodes = [peers[index].run_coroutine(_node_facts) for index in range(len(peers))]
        key_id = DHTID.generate(source=key)
        holders = sorted(range(len(peers)), key=lambda index: key_id.xor_distance(nodes[index][0]))[:5]
        writer = next(index for index in range(len(peers)) if index not in holders)  # stores to others only
        assert nodes[writer][1] >= nodes[writer][2], "the writer must know more nodes than num_replicas"
        readers = [peers[index] for index in holders]
        for reader in readers:
            a_minute_in_the_swarm(reader)
        peers[writer].run_coroutine(_count_searches)
        subkey = own_public_key(peers[writer])

        for samples in range(1, stores + 1):
            record = {"peer_id": peers[writer].peer_id.to_base58(), "samples_accumulated": samples,
                      "time": get_dht_time()}
            assert store_record(peers[writer], key, subkey, record, get_dht_time() + 60)
            # every true holder's own copy has it at once: a holder reads without asking
            reader = readers[samples % len(readers)]
            found = read_record(reader, key)
            assert found is not None and found.value[subkey].value["samples_accumulated"] == samples
        # a peer that is no holder asks the network, and gets the latest too
        other = next(dht for index, dht in enumerate(peers) if index not in holders and index != writer)
        assert read_record(other, key).value[subkey].value["samples_accumulated"] == stores

        searches = peers[writer].run_coroutine(_searches)
        print(f"{stores} stores from a node that knows {nodes[writer][1]} others: {searches} rpc_find calls")
        # one search visits each of the 7 other nodes at most once; hivemind's store searched at every store
        assert searches <= len(peers) - 1


def by_distance(peers: list, key: str) -> list[int]:
    """The peers' indices, nearest to ``key`` first (its holders are the first ``num_replicas``)."""
    from hivemind.dht.routing import DHTID

    key_id = DHTID.generate(source=key)
    node_ids = [dht.run_coroutine(_node_facts)[0] for dht in peers]
    return sorted(range(len(peers)), key=lambda index: key_id.xor_distance(node_ids[index]))


async def _stored_samples(dht, node, key, subkey):
    """Run in a DHT process: ``samples_accumulated`` of ``subkey``'s record in this node's own storage
    (not its cache, not the network), None when it holds none."""
    from hivemind.dht.routing import DHTID
    from hivemind.dht.validation import DHTRecord

    key_id, protocol = DHTID.generate(source=key), node.protocol
    item = protocol.storage.get(key_id)
    entry = item.value.get(subkey) if item is not None else None
    if entry is None:
        return None
    record = DHTRecord(key_id.to_bytes(), protocol.serializer.dumps(subkey), entry.value, entry.expiration_time)
    return protocol.serializer.loads(protocol.record_validator.strip_value(record))["samples_accumulated"]


@pytest.mark.timeout(240)
def test_a_store_reaches_the_next_nearest_when_a_holder_left_and_searches_again_after_it_or_a_while(tmp_path, meter):
    key = "local-run_progress"
    with loopback_dhts(tmp_path, 8) as peers:
        nearest = by_distance(peers, key)
        writer = nearest[-1]  # no holder: every copy it makes is a request
        others = [index for index in nearest if index != writer]
        holders, successor = others[:5], others[5]
        peers[writer].run_coroutine(_count_searches)
        subkey = own_public_key(peers[writer])

        def store(samples):
            record = {"peer_id": peers[writer].peer_id.to_base58(), "samples_accumulated": samples,
                      "time": get_dht_time()}
            return store_record(peers[writer], key, subkey, record, get_dht_time() + 60)

        def stored_at(index):
            return peers[index].run_coroutine(functools.partial(_stored_samples, key=key, subkey=subkey))

        assert store(1)
        searched = peers[writer].run_coroutine(_searches)
        assert searched > 0
        assert [stored_at(index) for index in holders] == [1] * 5
        assert stored_at(successor) is None  # only the nearest hold it

        peers[holders[0]].shutdown()
        assert store(2)
        assert [stored_at(index) for index in holders[1:] + [successor]] == [2] * 5  # still five holders
        assert peers[writer].run_coroutine(_searches) == searched  # that store used what it remembered

        assert store(3)  # ... and the next one searches again
        again = peers[writer].run_coroutine(_searches)
        assert again > searched
        assert store(4)
        assert peers[writer].run_coroutine(_searches) == again
        assert [stored_at(index) for index in holders[1:] + [successor]] == [4] * 5

        peers[writer].run_coroutine(_expire_holders)
        assert store(5)  # what a search found is trusted for HOLDERS_MEMORY_S only
        assert peers[writer].run_coroutine(_searches) > again
        assert [stored_at(index) for index in holders[1:] + [successor]] == [5] * 5


async def _forget_every_holder(dht, node):
    """Run in a DHT process: forget every key's holders found by a search (the next read searches again)."""
    node.p2ptrain_holders = {}


@pytest.mark.timeout(240)
def test_past_five_peers_a_peer_that_holds_no_copy_reads_from_one_holder_not_from_every_node(tmp_path, meter):
    """The scale model's first redesign (issue 25): hivemind's read asks every node among the 20 nearest to the
    key, and every answer carries all N records. At 8 peers a non-holder's read asked 7 nodes; now it asks 1
    of the key's 5 holders (2 until the peers behind NAT stopped serving), and still reads every peer's newest
    record, also after the nearest holder left."""
    from hivemind.dht.routing import DHTID

    key = metrics_key("local-run")
    with loopback_dhts(tmp_path, 8) as peers:
        nodes = [dht.run_coroutine(_node_facts) for dht in peers]
        key_id = DHTID.generate(source=key)
        nearest = sorted(range(len(peers)), key=lambda index: key_id.xor_distance(nodes[index][0]))
        reader_index, holders = nearest[-1], nearest[:5]
        reader = peers[reader_index]
        assert nodes[reader_index][1] >= nodes[reader_index][2], "the reader must know more nodes than num_replicas"
        for index, dht in enumerate(peers):
            record = LocalMetrics(peer_id=dht.peer_id.to_base58(), nickname=f"peer{index}", time=get_dht_time())
            assert publish_metrics(dht, "local-run", record)
        everyone = sorted(f"peer{index}" for index in range(len(peers)))
        a_minute_in_the_swarm(reader)
        assert sorted(row.nickname for row in read_metrics(reader, "local-run")) == everyone  # finds the holders

        reader.run_coroutine(_count_searches)
        before = sent_and_received(meter, "metrics")
        for _ in range(3):
            assert sorted(row.nickname for row in read_metrics(reader, "local-run")) == everyone
        from_holders = (sent_and_received(meter, "metrics") - before) / 3
        asked = reader.run_coroutine(_searches) / 3

        # hivemind's read of the same key, as every read was before
        reader.run_coroutine(_count_searches)
        before = sent_and_received(meter, "metrics")
        for _ in range(3):
            assert sorted(reader.get(key, latest=True).value) == sorted(own_public_key(dht) for dht in peers)
        everywhere = (sent_and_received(meter, "metrics") - before) / 3
        asked_everywhere = reader.run_coroutine(_searches) / 3
        print(f"a read of 8 records by a peer that holds none: {asked:.0f} requests, {from_holders:.0f} B from the "
              f"holders; {asked_everywhere:.0f} requests, {everywhere:.0f} B as hivemind reads")
        assert asked == 1 and asked_everywhere >= len(peers) - 1
        assert 0 < from_holders < everywhere / 2

        # a newer record reaches the reader through the holders
        renamed = LocalMetrics(peer_id=peers[holders[0]].peer_id.to_base58(), nickname="renamed", time=get_dht_time())
        assert publish_metrics(peers[holders[0]], "local-run", renamed)
        assert "renamed" in [row.nickname for row in read_metrics(reader, "local-run")]

        # the nearest holder leaves: the read goes on to the next holders and still finds every live peer's record
        peers[holders[0]].shutdown()
        alive = sorted(["renamed" if name == f"peer{holders[0]}" else name for name in everyone])
        for _ in range(2):
            assert sorted(row.nickname for row in read_metrics(reader, "local-run")) == alive


async def _forget_record(dht, node, key, subkey):
    """Run in a DHT process: drop ``subkey``'s record under ``key`` from this node's own storage (as a
    holder that joined after that peer's last store would lack it)."""
    from hivemind.dht.routing import DHTID

    item = node.protocol.storage.get(DHTID.generate(source=key))
    if item is not None:
        del item.value[subkey]


@pytest.mark.timeout(240)
def test_a_reader_asks_one_holder_and_keeps_the_records_that_earlier_answers_had(tmp_path, meter):
    key = "local-run_progress"
    with loopback_dhts(tmp_path, 8) as peers:
        nearest = by_distance(peers, key)
        holders, reader = nearest[:5], peers[nearest[-1]]
        for dht in peers:
            record = {"peer_id": dht.peer_id.to_base58(), "samples_accumulated": 1, "time": get_dht_time()}
            assert store_record(dht, key, own_public_key(dht), record, get_dht_time() + 60)
        a_minute_in_the_swarm(reader)
        assert len(read_record(reader, key).value) == len(peers)

        # four of the five holders lose one peer's record: a reader asks one holder a read, at random
        lost = own_public_key(peers[nearest[5]])
        for index in holders[1:]:
            peers[index].run_coroutine(functools.partial(_forget_record, key=key, subkey=lost))
        before = sent_and_received(meter, "progress")
        for _ in range(10):
            assert lost in read_record(reader, key).value, "a read lost a record an earlier answer had"
        asked = sent_and_received(meter, "progress") - before
        one_answer = asked / 10
        print(f"a read of {len(peers)} records from one holder: {one_answer:.0f} B")
        assert one_answer < 10_000  # one answer of these 8 records is 6.8 KB here; two were 13.5


async def _answered_long_ago(dht, node):
    """Run in a DHT process: every holder answer it remembers, made older than any ``max_age_s`` (moved back)."""
    node.p2ptrain_answered_at = {key_id: moment - 3600 for key_id, moment in node.p2ptrain_answered_at.items()}


@pytest.mark.timeout(240)
def test_a_read_that_a_recent_answer_serves_asks_nobody(tmp_path, meter):
    key = "local-run_progress"
    with loopback_dhts(tmp_path, 8) as peers:
        reader = peers[by_distance(peers, key)[-1]]  # no holder
        for dht in peers:
            record = {"peer_id": dht.peer_id.to_base58(), "samples_accumulated": 1, "time": get_dht_time()}
            assert store_record(dht, key, own_public_key(dht), record, get_dht_time() + 60)
        a_minute_in_the_swarm(reader)
        assert len(read_record(reader, key).value) == len(peers)  # asks a holder

        # the swarm view's read (max_age_s): what the holder answered a moment ago, no request
        before = sent_and_received(meter, "progress")
        assert len(read_record(reader, key, max_age_s=30).value) == len(peers)
        assert sent_and_received(meter, "progress") == before
        # ... the ProgressTracker's (no max_age_s) asks again
        assert len(read_record(reader, key).value) == len(peers)
        assert sent_and_received(meter, "progress") > before

        # an answer older than max_age_s is not enough
        reader.run_coroutine(_answered_long_ago)
        before = sent_and_received(meter, "progress")
        assert len(read_record(reader, key, max_age_s=30).value) == len(peers)
        assert sent_and_received(meter, "progress") > before
