"""DHT record validation for p2ptrain's own records (runs in hivemind's DHT process).

hivemind stores records under hashed keys, so a validator can only recognise
the keys of runs it was told about: :func:`follow_run` registers a run, after which this peer refuses to store, and ignores when
reading, any manifest or metrics record of that run that

- is not under a public-key subkey (the ``identity.OwnerSignatureValidator``
  installed next to this one then checks the signature, so nobody can write
  under another peer's key), or
- fails the schema (:class:`~p2ptrain.peers.swarm.manifest.Manifest`, or
  :class:`~p2ptrain.peers.swarm.records.LocalMetrics`), or
- claims a ``peer_id`` that is not the one of the key that signed it.

Records of runs this peer does not follow pass unchecked, as hivemind's own do.
"""

from __future__ import annotations

import logging

from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.utils import MSGPackSerializer

from p2ptrain.peers.net.identity import peer_id_of_public_key, public_key_from_bytes
from p2ptrain.peers.swarm.manifest import Manifest, manifest_key
from p2ptrain.peers.swarm.records import LocalMetrics, metrics_key

logger = logging.getLogger(__name__)


def owner_peer_id(subkey: bytes) -> str | None:
    """The peer id of the public key in a record's subkey (``b"[owner:ssh-ed25519 ...]"``), or None if
    there is none or it is not a key."""
    owners = RSASignatureValidator._PUBLIC_KEY_RE.findall(subkey)
    if len(owners) != 1:
        return None
    try:
        return peer_id_of_public_key(public_key_from_bytes(owners[0]))
    except (ValueError, TypeError):
        return None


class RunRecordValidator(RecordValidatorBase):
    """Schema and ownership checks for the manifest and metrics records of the followed runs.

    :param run_ids: the runs to check from the start; more are merged in by
        ``dht.add_validators([RunRecordValidator([run_id])])``.
    """

    def __init__(self, run_ids: tuple[str, ...] | list[str] = ()):
        self._kinds: dict[bytes, tuple[str, str]] = {}
        for run_id in run_ids:
            self._kinds[DHTID.generate(source=manifest_key(run_id)).to_bytes()] = ("manifest", run_id)
            self._kinds[DHTID.generate(source=metrics_key(run_id)).to_bytes()] = ("metrics", run_id)

    def validate(self, record: DHTRecord) -> bool:
        entry = self._kinds.get(record.key)
        if entry is None:
            return True
        kind, run_id = entry
        owners = RSASignatureValidator._PUBLIC_KEY_RE.findall(record.subkey)
        if record.subkey in DHTProtocol.RESERVED_SUBKEYS or len(owners) != 1:
            logger.debug("refused a %s record of run %s that is not under its owner's key", kind, run_id)
            return False
        try:
            value = MSGPackSerializer.loads(record.value)
            if kind == "manifest":
                if Manifest.model_validate(value, strict=True).run_id != run_id:
                    logger.debug("refused a manifest of another run stored under run %s", run_id)
                    return False
                return True
            if value is None:  # a peer that left clears its entry
                return True
            metrics = LocalMetrics.model_validate(value, strict=True)
            return metrics.peer_id == peer_id_of_public_key(public_key_from_bytes(owners[0]))
        except Exception as error:  # a validator must never raise: msgpack, pydantic and key parsing all can
            logger.debug("refused a %s record of run %s: %s", kind, run_id, error)
            return False

    def merge_with(self, other: RecordValidatorBase) -> bool:
        if not isinstance(other, RunRecordValidator):
            return False
        self._kinds.update(other._kinds)
        return True


def follow_run(dht, run_id: str) -> None:
    """Make this DHT check the manifest and metrics records of ``run_id`` (idempotent)."""
    followed = getattr(dht, "p2ptrain_followed_runs", None)
    if followed is None:
        followed = dht.p2ptrain_followed_runs = set()
    if run_id in followed:
        return
    dht.add_validators([RunRecordValidator([run_id])])
    followed.add(run_id)
