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
from p2ptrain.peers.swarm.records import LocalMetrics, every_metrics_key

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
        self._run_ids = set(run_ids)
        self._kinds: dict[bytes, tuple[str, str]] | None = None  # made at the first record (``_kind_of``)

    def __getstate__(self) -> dict:
        """Only the runs: the DHT process gets the validator through a pipe that a large message breaks
        (hivemind's DHT reads it without blocking), and the keys' ids are thousands (every shard's)."""
        return {"_run_ids": self._run_ids, "_kinds": None}

    def _kind_of(self, key: bytes) -> tuple[str, str] | None:
        """``(kind, run_id)`` of a DHT key's id: a followed run's manifest key, or one of its metrics keys (the
        run's own and every shard's: 2,047 ids a run, made once, in milliseconds); None for any other key."""
        if self._kinds is None:
            self._kinds = {}
            for run_id in self._run_ids:
                self._kinds[DHTID.generate(source=manifest_key(run_id)).to_bytes()] = ("manifest", run_id)
                for metrics in every_metrics_key(run_id):
                    self._kinds[DHTID.generate(source=metrics).to_bytes()] = ("metrics", run_id)
        return self._kinds.get(key)

    def validate(self, record: DHTRecord) -> bool:
        entry = self._kind_of(record.key)
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
        self._run_ids |= other._run_ids
        self._kinds = None  # made again, with the new runs' keys
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
