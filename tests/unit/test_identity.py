"""Peer identities: Ed25519 for new peers, RSA identities made before still load, and records signed
with either validate (``p2ptrain.peers.net.identity``)."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.validation import DHTRecord
from hivemind.p2p import PeerID
from hivemind.proto import crypto_pb2
from hivemind.utils import MSGPackSerializer
from hivemind.utils.crypto import RSAPrivateKey

from p2ptrain.peers.net.identity import (
    Ed25519PrivateKey,
    OwnerSignatureValidator,
    create_identity,
    install_peer_ids_of_ed25519_identities,
    peer_id_of_public_key,
    read_identity,
)


def signed(validator: RSASignatureValidator, value=b"\x01") -> DHTRecord:
    record = DHTRecord(key=b"run_progress", subkey=MSGPackSerializer.dumps(validator.local_public_key),
                       value=MSGPackSerializer.dumps(value), expiration_time=1e10)
    return dataclasses.replace(record, value=validator.sign_value(record))


def test_a_new_identity_is_ed25519_and_reads_back_as_the_same_key(tmp_path):
    key = create_identity(tmp_path / "peer.key")
    assert crypto_pb2.PrivateKey.FromString((tmp_path / "peer.key").read_bytes()).key_type == crypto_pb2.Ed25519
    again = read_identity((tmp_path / "peer.key").read_bytes())
    assert isinstance(again, Ed25519PrivateKey) and again.to_bytes() == key.to_bytes()
    assert pickle.loads(pickle.dumps(key)).to_bytes() == key.to_bytes()  # hivemind's DHT process gets a copy
    with pytest.raises(FileExistsError):
        create_identity(tmp_path / "peer.key")


def test_an_rsa_identity_made_before_still_reads(tmp_path):
    key = RSAPrivateKey()
    data = crypto_pb2.PrivateKey(key_type=crypto_pb2.RSA, data=key.to_bytes()).SerializeToString()
    assert read_identity(data).to_bytes() == key.to_bytes()
    # its peer id is hivemind's (a sha2-256 multihash), the one p2pd derives
    assert peer_id_of_public_key(key.get_public_key()) == PeerID.from_identity(data).to_base58()


@pytest.mark.parametrize("data, says", [
    (b"not a key", None),
    (crypto_pb2.PrivateKey(key_type=crypto_pb2.Secp256k1, data=bytes(32)).SerializeToString(), "Secp256k1"),
    (crypto_pb2.PrivateKey(key_type=crypto_pb2.Ed25519, data=bytes(10)).SerializeToString(), "64 bytes, not 10"),
    (crypto_pb2.PrivateKey(key_type=crypto_pb2.Ed25519, data=bytes(64)).SerializeToString(), "does not match"),
])
def test_anything_else_is_one_value_error(data, says):
    with pytest.raises(ValueError, match=says):
        read_identity(data)


def test_an_ed25519_peer_id_is_the_key_itself_as_libp2p_names_it(tmp_path):
    key = create_identity(tmp_path / "peer.key")
    peer_id = peer_id_of_public_key(key.get_public_key())
    assert peer_id.startswith("12D3KooW")
    install_peer_ids_of_ed25519_identities()  # hivemind's check that an identity is free reads it through this
    assert PeerID.from_identity((tmp_path / "peer.key").read_bytes()).to_base58() == peer_id


@pytest.mark.parametrize("make_key", [Ed25519PrivateKey, RSAPrivateKey], ids=["ed25519", "rsa"])
def test_records_signed_with_either_key_validate_and_tampered_ones_do_not(make_key):
    owner = OwnerSignatureValidator(make_key())
    checker = OwnerSignatureValidator(Ed25519PrivateKey())  # another peer's validator checks the record
    record = signed(owner)
    assert checker.validate(record)
    assert not checker.validate(dataclasses.replace(record, value=record.value.replace(b"\x01", b"\x02", 1)))
    # signed by someone else under the owner's key
    stranger = signed(OwnerSignatureValidator(make_key()))
    assert not checker.validate(dataclasses.replace(stranger, subkey=record.subkey))
    # a garbled key is refused, not raised
    assert not checker.validate(dataclasses.replace(record, subkey=MSGPackSerializer.dumps(b"[owner:ssh-ed25519 AAAA]")))


def test_records_of_hivemind_s_own_rsa_validator_validate():
    assert OwnerSignatureValidator(Ed25519PrivateKey()).validate(signed(RSASignatureValidator(RSAPrivateKey())))


def test_it_takes_the_place_of_the_rsa_validator_that_hivemind_s_progress_tracker_adds():
    ours = OwnerSignatureValidator(Ed25519PrivateKey())
    assert ours.merge_with(RSASignatureValidator(RSAPrivateKey()))


def test_an_ed25519_signed_entry_is_smaller_by_most_of_the_rsa_key_and_signature():
    ed25519, rsa = signed(OwnerSignatureValidator(Ed25519PrivateKey())), signed(OwnerSignatureValidator(RSAPrivateKey()))
    saved = len(rsa.subkey) + len(rsa.value) - len(ed25519.subkey) - len(ed25519.value)
    assert 500 < saved < 700, saved
