"""A peer's identity: the key that names it in libp2p (its peer id) and signs its DHT records.

New identities are Ed25519 keys, libp2p's default (peer ids ``12D3KooW...``);
identities made before (hivemind's RSA-2048 keys) still load and their records
still validate. Every signed record a peer publishes (progress, metrics, the
manifest) carries its owner's public key in its subkey and a signature in its
value, and a read of the progress or metrics key carries every peer's entry:
with an RSA key each entry spends 747 bytes on the key and the signature, with
an Ed25519 key 190, so a progress entry shrinks from about 0.85 KB to 0.3
(``tests/unit/test_identity.py``; the scale model's "Ed25519 records" design).
That cuts what every read costs at any swarm size, not how it grows (issue 25).

The file holds a libp2p private-key protobuf, the format p2pd reads, so the
same file gives p2pd its peer id. The key objects follow hivemind's
``PrivateKey`` / ``PublicKey`` interface (base64 signatures, OpenSSH public
keys), so hivemind's ProgressTracker signs with them unchanged.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import logging
import os
from pathlib import Path

import multihash
from cryptography import exceptions
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.validation import DHTRecord
from hivemind.p2p import PeerID
from hivemind.proto import crypto_pb2
from hivemind.utils.crypto import PrivateKey, PublicKey, RSAPrivateKey, RSAPublicKey

logger = logging.getLogger(__name__)

# libp2p names a key by its protobuf itself (an "identity" multihash) when that is this short or shorter
_INLINE_PEER_ID_BYTES = 42


class Ed25519PrivateKey(PrivateKey):
    """An Ed25519 key with hivemind's ``PrivateKey`` interface (picklable, for hivemind's DHT process).

    Args:
        key: the cryptography key; a new one when None.
    """

    def __init__(self, key: ed25519.Ed25519PrivateKey | None = None):
        self._private_key = key or ed25519.Ed25519PrivateKey.generate()

    def sign(self, data: bytes) -> bytes:
        return base64.b64encode(self._private_key.sign(data))

    def get_public_key(self) -> Ed25519PublicKey:
        return Ed25519PublicKey(self._private_key.public_key())

    def to_bytes(self) -> bytes:
        """The 32-byte seed and the 32-byte public key: libp2p's encoding of an Ed25519 private key."""
        seed = self._private_key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                               serialization.NoEncryption())
        return seed + self.get_public_key().raw_bytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> Ed25519PrivateKey:
        """The key of :meth:`to_bytes`' encoding.

        :raises ValueError: if ``data`` is not 64 bytes, or its public half is not its seed's.
        """
        if len(data) != 64:
            raise ValueError(f"an Ed25519 identity has 64 bytes, not {len(data)}")
        key = cls(ed25519.Ed25519PrivateKey.from_private_bytes(data[:32]))
        if key.get_public_key().raw_bytes() != data[32:]:
            raise ValueError("the Ed25519 key's public half does not match its seed")
        return key

    def __getstate__(self):
        return {"_private_key": self.to_bytes()}

    def __setstate__(self, state):
        self._private_key = Ed25519PrivateKey.from_bytes(state["_private_key"])._private_key


class Ed25519PublicKey(PublicKey):
    """An Ed25519 public key with hivemind's ``PublicKey`` interface."""

    def __init__(self, key: ed25519.Ed25519PublicKey):
        self._public_key = key

    def verify(self, data: bytes, signature: bytes) -> bool:
        try:
            self._public_key.verify(base64.b64decode(signature), data)
            return True
        except (ValueError, exceptions.InvalidSignature):
            return False

    def raw_bytes(self) -> bytes:
        return self._public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    def to_bytes(self) -> bytes:
        return self._public_key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)

    @classmethod
    def from_bytes(cls, key: bytes) -> Ed25519PublicKey:
        loaded = serialization.load_ssh_public_key(key)
        if not isinstance(loaded, ed25519.Ed25519PublicKey):
            raise ValueError(f"expected an Ed25519 public key, got {type(loaded).__name__}")
        return cls(loaded)


def public_key_from_bytes(key: bytes) -> RSAPublicKey | Ed25519PublicKey:
    """The public key in a record's ``[owner:...]`` (OpenSSH format, Ed25519 or RSA).

    :raises ValueError: if it is neither.
    """
    loaded = serialization.load_ssh_public_key(key)
    if isinstance(loaded, ed25519.Ed25519PublicKey):
        return Ed25519PublicKey(loaded)
    if isinstance(loaded, rsa.RSAPublicKey):
        return RSAPublicKey(loaded)
    raise ValueError(f"an owner key must be Ed25519 or RSA, not {type(loaded).__name__}")


def peer_id_of_public_key(public_key: RSAPublicKey | Ed25519PublicKey) -> str:
    """The libp2p peer id (base58) of a public key, as libp2p derives it."""
    if isinstance(public_key, Ed25519PublicKey):
        protobuf = crypto_pb2.PublicKey(key_type=crypto_pb2.Ed25519, data=public_key.raw_bytes()).SerializeToString()
    else:
        encoded = public_key._public_key.public_bytes(encoding=serialization.Encoding.DER,
                                                      format=serialization.PublicFormat.SubjectPublicKeyInfo)
        protobuf = crypto_pb2.PublicKey(key_type=crypto_pb2.RSA, data=encoded).SerializeToString()
    if len(protobuf) <= _INLINE_PEER_ID_BYTES:
        digest = bytes([0x00, len(protobuf)]) + protobuf  # the "identity" multihash: the key itself
    else:
        digest = multihash.encode(hashlib.sha256(protobuf).digest(), multihash.coerce_code("sha2-256"))
    return PeerID(digest).to_base58()


def create_identity(identity_path: Path) -> Ed25519PrivateKey:
    """A new Ed25519 identity, written to ``identity_path`` (mode 0600; the folder is made, 0700).

    :raises FileExistsError: if the file exists (two workers starting at once must not both write one).
    """
    identity_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = Ed25519PrivateKey()
    protobuf = crypto_pb2.PrivateKey(key_type=crypto_pb2.KeyType.Ed25519, data=key.to_bytes())
    descriptor = os.open(identity_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        file.write(protobuf.SerializeToString())
    logger.info("created a new peer identity in %s", identity_path)
    return key


def read_identity(data: bytes) -> Ed25519PrivateKey | RSAPrivateKey:
    """The key in an identity file's bytes: Ed25519, or RSA (identities made before Ed25519).

    :raises ValueError: if they are neither (protobuf's and cryptography's errors are turned into it).
    """
    try:
        protobuf = crypto_pb2.PrivateKey.FromString(data)
        if protobuf.key_type == crypto_pb2.KeyType.Ed25519:
            return Ed25519PrivateKey.from_bytes(protobuf.data)
        if protobuf.key_type == crypto_pb2.KeyType.RSA:
            serialization.load_der_private_key(protobuf.data, password=None)
            key = RSAPrivateKey.__new__(RSAPrivateKey)
            key.__setstate__({"_private_key": protobuf.data})  # hivemind's own way to rebuild a key from DER
            return key
        raise ValueError(f"a {crypto_pb2.KeyType.Name(protobuf.key_type)} key, not Ed25519 or RSA")
    except ValueError:
        raise
    except Exception as error:  # protobuf and cryptography raise several unrelated types
        raise ValueError(str(error) or type(error).__name__) from None


def install_peer_ids_of_ed25519_identities() -> None:
    """Make hivemind's ``PeerID.from_identity`` (its check that an identity is not in use already)
    read Ed25519 identities too; it reads only RSA ones. Once a process, and in the DHT process forked
    from it."""
    if getattr(PeerID.from_identity, "reads_ed25519", False):
        return
    original = PeerID.from_identity

    def from_identity(data: bytes) -> PeerID:
        key = read_identity(data)
        if isinstance(key, Ed25519PrivateKey):
            return PeerID.from_base58(peer_id_of_public_key(key.get_public_key()))
        return original(data)

    from_identity.reads_ed25519 = True
    PeerID.from_identity = staticmethod(from_identity)


class OwnerSignatureValidator(RSASignatureValidator):
    """hivemind's ``RSASignatureValidator`` for owner keys of both kinds, Ed25519 and RSA: records under
    ``[owner:<public key>]`` must be signed by that key (hivemind's own reads only RSA keys).

    Being one, it takes the place of the RSASignatureValidator that hivemind's ProgressTracker adds.

    Args:
        private_key: the key that signs this peer's records (Ed25519 or RSA).
    """

    def __init__(self, private_key: Ed25519PrivateKey | RSAPrivateKey):
        super().__init__(private_key)

    def validate(self, record: DHTRecord) -> bool:
        public_keys = self._PUBLIC_KEY_RE.findall(record.key)
        if record.subkey is not None:
            public_keys += self._PUBLIC_KEY_RE.findall(record.subkey)
        if not public_keys:
            return True  # not a protected record
        if len(set(public_keys)) > 1:
            return False
        signatures = self._SIGNATURE_RE.findall(record.value)
        if len(signatures) != 1:
            return False
        try:
            public_key = public_key_from_bytes(public_keys[0])
        except (ValueError, TypeError, exceptions.UnsupportedAlgorithm):
            return False
        stripped = dataclasses.replace(record, value=self.strip_value(record))
        return public_key.verify(self._serialize_record(stripped), signatures[0])
