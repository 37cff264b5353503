"""p2ptrain's DHT records between real hivemind peers on 127.0.0.1.

Each DHT runs in hivemind's own background process with its own p2pd; every
test shuts down what it started. The "attacker" is a plain hivemind.DHT with
no validators, so it can write whatever it likes into its own storage and
send it to the others, who must refuse it.
"""

import stat
import time

import hivemind
import pytest
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.optim.progress_tracker import ProgressTracker
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils import get_dht_time

from p2ptrain.peers.net.dht import (
    DHTStartError,
    own_public_key,
    signing_key,
    start_dht,
    visible_addresses,
)
from p2ptrain.peers.net.identity import peer_id_of_public_key
from p2ptrain.peers.swarm.manifest import ManifestError, averaging_prefix, manifest_key, new_manifest
from p2ptrain.peers.swarm.records import LocalMetrics, metrics_key
from p2ptrain.peers.swarm.run_records import fetch_manifest, publish_manifest, publish_metrics, read_manifests, read_metrics, withdraw_metrics
from p2ptrain.peers.swarm.view import read_swarm

pytestmark = pytest.mark.swarm
LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


@pytest.fixture
def peers(tmp_path):
    """Start DHT peers on loopback: ``peers("a")`` starts alone, ``peers("b", a)`` joins a. All are shut down after."""
    started = []

    def start(name, *bootstrap, **options):
        initial = [address for dht in bootstrap for address in visible_addresses(dht)]
        dht = start_dht(initial, tmp_path / f"{name}.key", host_maddrs=LOOPBACK, start_timeout=30, **options)
        started.append(dht)
        return dht

    try:
        yield start
    finally:
        for dht in reversed(started):
            dht.shutdown()


@pytest.fixture
def attacker():
    """A plain hivemind peer without p2ptrain's validators (``signing=True``: it signs its records).

    Joined later via ``attacker(dht)``.
    """
    started = []

    def start(bootstrap, signing=False):
        validators = [RSASignatureValidator(RSAPrivateKey())] if signing else []
        dht = hivemind.DHT(
            initial_peers=visible_addresses(bootstrap), host_maddrs=LOOPBACK, record_validators=validators, start=True
        )
        dht.p2ptrain_private_key = validators[0]._private_key if signing else None
        started.append(dht)
        return dht

    try:
        yield start
    finally:
        for dht in started:
            dht.shutdown()


def metrics_of(dht, nickname, manifest_hash="", **fields):
    return LocalMetrics(
        peer_id=dht.peer_id.to_base58(), nickname=nickname, manifest_hash=manifest_hash, time=get_dht_time(), **fields
    )


def wait_for(read, condition, timeout=15.0):
    deadline = time.monotonic() + timeout
    value = read()
    while not condition(value) and time.monotonic() < deadline:
        time.sleep(0.3)
        value = read()
    return value


@pytest.mark.timeout(90)
def test_identity_persists_across_restart(peers, tmp_path):
    first = peers("a")
    peer_id, public_key = first.peer_id, own_public_key(first)
    first.shutdown()

    second = peers("a")
    assert second.peer_id == peer_id
    assert own_public_key(second) == public_key
    # a new identity is an Ed25519 key, and the peer id p2pd derives from it is the one records are checked against
    assert public_key.startswith(b"[owner:ssh-ed25519 ")
    assert peer_id.to_base58() == peer_id_of_public_key(signing_key(second).get_public_key())
    assert stat.S_IMODE((tmp_path / "a.key").stat().st_mode) == 0o600


@pytest.mark.timeout(90)
def test_an_rsa_identity_made_before_ed25519_keeps_its_peer_id_and_its_records_are_read(peers, tmp_path):
    from hivemind.p2p import PeerID
    from hivemind.proto import crypto_pb2

    identity = crypto_pb2.PrivateKey(key_type=crypto_pb2.RSA, data=RSAPrivateKey().to_bytes()).SerializeToString()
    (tmp_path / "old.key").write_bytes(identity)
    alice = peers("a")
    old = peers("old", alice)
    assert old.peer_id == PeerID.from_identity(identity) and own_public_key(old).startswith(b"[owner:ssh-rsa ")
    assert publish_metrics(old, "mixed-run", metrics_of(old, "old"))
    assert publish_metrics(alice, "mixed-run", metrics_of(alice, "alice"))
    for reader in (alice, old):
        found = wait_for(lambda: read_metrics(reader, "mixed-run"), lambda records: len(records) == 2)
        assert sorted(record.nickname for record in found) == ["alice", "old"]


@pytest.mark.timeout(90)
def test_second_peer_with_the_same_identity_is_refused(peers, tmp_path):
    first = peers("a")
    with pytest.raises(DHTStartError, match="already running with the identity"):
        start_dht(visible_addresses(first), tmp_path / "a.key", host_maddrs=LOOPBACK, start_timeout=30)


@pytest.mark.timeout(60)
def test_corrupt_identity_file_is_explained(tmp_path):
    (tmp_path / "a.key").write_bytes(b"not a key")
    with pytest.raises(DHTStartError, match="is not a peer identity"):
        start_dht([], tmp_path / "a.key", host_maddrs=LOOPBACK)


@pytest.mark.timeout(90)
def test_unreachable_bootstrap_peer_is_explained(tmp_path):
    nobody = "/ip4/127.0.0.1/tcp/9/p2p/QmXfDaa7kkzvbYoFhj5hbMaJXCFdHUrwDPeVkjYEM4gg6S"
    with pytest.raises(DHTStartError, match="none of the bootstrap peers answered"):
        start_dht([nobody], tmp_path / "a.key", host_maddrs=LOOPBACK, start_timeout=30)


@pytest.mark.timeout(60)
def test_visible_addresses_carry_the_peer_id(peers):
    alone = peers("a")
    addresses = visible_addresses(alone)
    assert addresses
    assert all(address.endswith(f"/p2p/{alone.peer_id.to_base58()}") for address in addresses)
    assert all(address.startswith("/ip4/127.0.0.1/tcp/") for address in addresses)


@pytest.mark.timeout(90)
def test_manifest_published_by_creator_is_fetched_by_joiner(peers):
    creator = peers("a")
    joiner = peers("b", creator)
    manifest = new_manifest("shared-run", mode="diloco", lora={"r": 4, "target_modules": ["q_proj"]})
    publish_manifest(creator, manifest)

    fetched = fetch_manifest(joiner, "shared-run", timeout=20)
    assert fetched == manifest
    assert averaging_prefix(fetched) == averaging_prefix(manifest)


@pytest.mark.timeout(60)
def test_fetching_an_unknown_run_fails_within_timeout(peers):
    creator = peers("a")
    joiner = peers("b", creator)
    started = time.monotonic()
    with pytest.raises(ManifestError) as caught:
        fetch_manifest(joiner, "no-such-run", timeout=3)
    assert time.monotonic() - started < 15
    assert "no run named 'no-such-run' was found through /ip4/127.0.0.1/" in caught.value.message
    assert "bootstrap address" in caught.value.fix


@pytest.mark.timeout(90)
def test_second_creator_cannot_redefine_a_run(peers):
    creator = peers("a")
    rival = peers("b", creator)
    publish_manifest(creator, new_manifest("taken", created_at=1000.0))
    with pytest.raises(ManifestError, match="already exists with other settings"):
        publish_manifest(rival, new_manifest("taken", created_at=2000.0, seed=7))
    # Republishing the same manifest (as joiners do) is fine.
    publish_manifest(rival, fetch_manifest(rival, "taken", timeout=10))


@pytest.mark.timeout(90)
def test_manifest_record_failing_the_schema_is_refused(peers, attacker):
    creator = peers("a")
    joiner = peers("b", creator)
    good = new_manifest("guarded")
    publish_manifest(creator, good)
    assert fetch_manifest(joiner, "guarded", timeout=10) == good
    bad = {**good.model_dump(mode="json"), "target_batch_size": -5}

    # Signed by its publisher, but not a manifest: no peer that follows the run stores it.
    stored = joiner.store(
        manifest_key("guarded"), subkey=own_public_key(joiner), value=bad, expiration_time=get_dht_time() + 60
    )
    assert stored is False

    # A peer that signs but skips schema checks keeps it in its own storage; the others ignore it.
    intruder = attacker(creator, signing=True)
    intruder.store(
        manifest_key("guarded"), subkey=own_public_key(intruder), value=bad, expiration_time=get_dht_time() + 60
    )
    intruder.store(
        manifest_key("unclaimed"), subkey=own_public_key(intruder), value=bad, expiration_time=get_dht_time() + 60
    )
    assert fetch_manifest(joiner, "guarded", timeout=10) == good
    assert list(read_manifests(joiner, "guarded").values()) == [good]
    with pytest.raises(ManifestError, match="no run named 'unclaimed'"):
        fetch_manifest(joiner, "unclaimed", timeout=2)


@pytest.mark.timeout(90)
def test_read_metrics_returns_every_peers_record(peers):
    alice = peers("a")
    bob = peers("b", alice)
    assert publish_metrics(alice, "metrics-run", metrics_of(alice, "alice", loss=2.5, samples_per_second=10.0))
    assert publish_metrics(bob, "metrics-run", metrics_of(bob, "bob", loss=float("nan"), epoch=3))

    for reader in (alice, bob):
        records = wait_for(lambda: read_metrics(reader, "metrics-run"), lambda found: len(found) == 2)
        by_name = {record.nickname: record for record in records}
        assert set(by_name) == {"alice", "bob"}
        assert by_name["alice"].loss == 2.5 and by_name["alice"].peer_id == alice.peer_id.to_base58()
        assert by_name["bob"].loss is None and by_name["bob"].epoch == 3


@pytest.mark.timeout(90)
def test_withdrawn_metrics_disappear_for_other_peers(peers):
    alice = peers("a")
    bob = peers("b", alice)
    assert publish_metrics(alice, "leave-run", metrics_of(alice, "alice"))
    assert publish_metrics(bob, "leave-run", metrics_of(bob, "bob"))
    assert wait_for(lambda: len(read_metrics(alice, "leave-run")), lambda count: count == 2) == 2

    assert withdraw_metrics(bob, "leave-run")
    assert [record.nickname for record in read_metrics(alice, "leave-run")] == ["alice"]


@pytest.mark.timeout(90)
def test_forged_metrics_under_another_peers_key_are_rejected(peers, attacker):
    alice = peers("a")
    bob = peers("b", alice)
    assert publish_metrics(alice, "forge-run", metrics_of(alice, "alice"))
    assert publish_metrics(bob, "forge-run", metrics_of(bob, "bob"))
    forged = metrics_of(alice, "mallory").model_dump(mode="json")
    expiration = get_dht_time() + 120

    # A p2ptrain peer cannot store it under alice's key: it has no signature by alice's key.
    key = metrics_key("forge-run")
    assert not bob.store(key, subkey=own_public_key(alice), value=forged, expiration_time=expiration)
    # Nor under its own key while claiming alice's peer id.
    assert not bob.store(key, subkey=own_public_key(bob), value=forged, expiration_time=expiration)
    # A peer that skips validation keeps it in its own storage, but the others ignore it.
    intruder = attacker(alice)
    intruder.store(key, subkey=own_public_key(alice), value=forged, expiration_time=expiration)

    for reader in (alice, bob):
        assert sorted(record.nickname for record in read_metrics(reader, "forge-run")) == ["alice", "bob"]


@pytest.mark.timeout(90)
def test_metrics_stored_before_following_the_run_are_checked_on_read(peers):
    alice = peers("a")
    bob = peers("b", alice)
    claims_alice = metrics_of(alice, "mallory").model_dump(mode="json")
    # bob does not follow the run yet, so his own storage keeps this record signed by him ...
    expiration = get_dht_time() + 60
    bob.store(metrics_key("late-run"), subkey=own_public_key(bob), value=claims_alice, expiration_time=expiration)
    # ... but reading checks that each record's peer id is its signer's.
    assert read_metrics(bob, "late-run") == []


@pytest.mark.timeout(120)
def test_read_swarm_combines_hivemind_progress_and_metrics(peers):
    alice = peers("a")
    bob = peers("b", alice)
    manifest = new_manifest("swarm-run", target_batch_size=1000)
    other = new_manifest("swarm-run", target_batch_size=1000, seed=1)
    # bob started last, so his key is hivemind's process-wide one: a tracker made
    # without a key, as hivemind.Optimizer makes it, must sign as bob.
    bob_tracker = ProgressTracker(bob, averaging_prefix(manifest), manifest.target_batch_size, start=True)
    alice_tracker = ProgressTracker(
        alice, averaging_prefix(manifest), manifest.target_batch_size, private_key=signing_key(alice), start=True
    )
    try:
        bob_tracker.report_local_progress(local_epoch=0, samples_accumulated=120)
        alice_tracker.report_local_progress(local_epoch=0, samples_accumulated=80)
        publish_metrics(alice, "swarm-run", metrics_of(alice, "alice", manifest.manifest_hash()))
        publish_metrics(bob, "swarm-run", metrics_of(bob, "bob", other.manifest_hash()))

        view = wait_for(
            lambda: read_swarm(alice, "swarm-run", manifest.manifest_hash(), manifest.target_batch_size),
            lambda view: view.samples_accumulated == 200 and len(view.peers) == 2,
        )
        assert view.epoch == 0
        assert view.samples_accumulated == 200
        assert view.target_batch_size == 1000
        rows = {row.nickname: row for row in view.peers}
        assert rows["alice"].compatible is True and rows["alice"].is_local is True
        assert rows["bob"].compatible is False and rows["bob"].is_local is False
        # bob trains under our prefix in this test, so he counts for progress but his manifest differs.
        assert view.num_peers == 1
    finally:
        alice_tracker.shutdown(timeout=10)
        bob_tracker.shutdown(timeout=10)
