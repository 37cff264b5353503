"""The swarm's records read from a peer's own copy: counted with p2ptrain's traffic meter
between real hivemind DHT peers on 127.0.0.1 (``tests/metered_peers.py``).
"""

import pytest
from hivemind.utils import get_dht_time

from metered_peers import loopback_dhts, sent_and_received
from p2ptrain.peers.net.local_reads import FULL_COPY_AFTER_S
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
