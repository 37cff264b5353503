"""Peers that stop serving the DHT (``dht.stop_serving``: a peer behind NAT) still store and read every
record, and no other peer asks them anything: 8 real hivemind DHT peers on 127.0.0.1, 3 of them serving.
"""

import pytest
from hivemind.utils import get_dht_time

from metered_peers import loopback_dhts, sent_and_received
from p2ptrain.peers.net.dht import own_public_key, stop_serving
from p2ptrain.peers.net.local_reads import FULL_COPY_AFTER_S, read_record, store_record

pytestmark = pytest.mark.swarm

KEY = "local-run_progress"
SERVING = 3


async def _count_answers(dht, node):
    """Run in a DHT process: count the DHT requests it answers from now on (``_answers`` reads it)."""
    answers = node.p2ptrain_test_answers = [0]
    for name in ("rpc_ping", "rpc_store", "rpc_find"):
        method = getattr(node.protocol, name)

        async def counted(*args, __method=method, **kwargs):
            answers[0] += 1
            return await __method(*args, **kwargs)

        setattr(node.protocol, name, counted)


async def _answers(dht, node) -> int:
    return node.p2ptrain_test_answers[0]


async def _known_nodes(dht, node) -> set[str]:
    """Run in a DHT process: the peer ids (base58) in its routing table."""
    return {peer_id.to_base58() for peer_id in node.protocol.routing_table.uid_to_peer_id.values()}


async def _stored_owners(dht, node) -> int:
    """Run in a DHT process: how many peers' records its own storage holds under ``KEY``."""
    from hivemind.dht.routing import DHTID

    item = node.protocol.storage.get(DHTID.generate(source=KEY))
    return len(item.value) if item is not None else 0


def store(dht, samples: int) -> bool:
    record = {"peer_id": dht.peer_id.to_base58(), "samples_accumulated": samples, "time": get_dht_time()}
    return store_record(dht, KEY, own_public_key(dht), record, get_dht_time() + 60)


def samples_read_by(dht) -> dict[bytes, int]:
    found = read_record(dht, KEY)
    return {subkey: entry.value["samples_accumulated"] for subkey, entry in (found.value if found else {}).items()}


@pytest.mark.timeout(240)
def test_peers_that_stop_serving_store_and_read_every_record_and_are_asked_nothing(tmp_path, meter):
    with loopback_dhts(tmp_path, 8) as peers:
        servers, clients = peers[:SERVING], peers[SERVING:]
        for dht in clients:
            assert stop_serving(dht) is True
            assert dht.client_mode
        assert stop_serving(clients[0]) is False  # once is enough
        for index, dht in enumerate(clients):  # hivemind's own store, while the others' tables still hold them
            assert dht.store(f"manifest-{index}", value=index, expiration_time=get_dht_time() + 60)
        for dht in clients:
            dht.run_coroutine(_count_answers)

        for round_ in (1, 2):  # the first round's searches meet the clients' stale entries and drop them
            for index, dht in enumerate(peers):
                assert store(dht, 10 * round_ + index), f"peer {index}'s record reached no holder"
        expected = {own_public_key(dht): 20 + index for index, dht in enumerate(peers)}

        # the serving peers hold every record, and read it from their own copy after a minute
        assert [server.run_coroutine(_stored_owners) for server in servers] == [len(peers)] * SERVING
        for server in servers:
            server.p2ptrain_started -= FULL_COPY_AFTER_S + 1
            assert samples_read_by(server) == expected
        # the clients read every record from the holders, at once and after a minute
        for client in clients:
            assert samples_read_by(client) == expected
            client.p2ptrain_started -= FULL_COPY_AFTER_S + 1
            assert samples_read_by(client) == expected

        # a client's store goes straight to the holders it remembers: no search whose answers carry every record
        client = clients[0]
        before = sent_and_received(meter, "progress")
        assert store(client, 30)
        direct = sent_and_received(meter, "progress") - before
        record = {"peer_id": client.peer_id.to_base58(), "samples_accumulated": 31, "time": get_dht_time()}
        before = sent_and_received(meter, "progress")
        assert client.store(KEY, subkey=own_public_key(client), value=record, expiration_time=get_dht_time() + 61)
        searched = sent_and_received(meter, "progress") - before
        print(f"a client's record stored to {SERVING} holders: {direct:.0f} B straight, {searched:.0f} B by hivemind")
        assert 0 < direct < searched / 2

        # a read carries every peer's entry: signed with Ed25519 identities, each costs ~0.3 KB on the wire
        # (RSA-2048's key and signature alone took 747 B an entry: ``identity``)
        before = sent_and_received(meter, "progress")
        assert samples_read_by(client)[own_public_key(client)] == 31  # hivemind's store, the last
        read = sent_and_received(meter, "progress") - before
        print(f"a client's read of {len(peers)} records: {read:.0f} B")
        assert 0 < read < len(peers) * 450

        # nobody asked a client anything, and the serving peers' tables hold only serving peers
        assert [client.run_coroutine(_answers) for client in clients] == [0] * len(clients)
        serving_ids = {dht.peer_id.to_base58() for dht in servers}
        for server in servers:
            assert server.run_coroutine(_known_nodes) <= serving_ids
