"""Per-peer metrics records: what each peer in a run says about itself.

Every peer publishes a :class:`LocalMetrics` under the DHT key
``{run_id}_metrics``, subkey = its own RSA public key, signed. The key uses the
plain run id (not the averaging prefix) so peers with another manifest are
still seen, marked incompatible by their ``manifest_hash``.

Importable without hivemind (pydantic only); hivemind is imported lazily.
"""

from __future__ import annotations

import logging
import math
from typing import Literal

import pydantic

logger = logging.getLogger(__name__)

METRICS_EXPIRATION_S = 90.0  # the worker writes its record every 30 s


def metrics_key(run_id: str) -> str:
    """The DHT key under which a run's per-peer metrics live."""
    return f"{run_id}_metrics"


class LocalMetrics(pydantic.BaseModel):
    """One peer's view of itself, as shown in every other peer's swarm table.

    ``peer_id`` is the libp2p peer id (base58) and must belong to the key that
    signs the record. ``device`` is e.g. ``cuda:0 (RTX 4090)`` or ``cpu``;
    ``precision`` e.g. ``bf16``; ``quantization`` ``none``, ``nf4`` or
    ``int8``. ``samples_per_second`` is this peer's recent training speed,
    ``loss`` its latest finite training loss (None before the first step or
    when the last one was not finite), ``epoch`` its local epoch,
    ``trained_samples`` all samples it trained in the run, ``contributed_samples``
    those that entered an adopted average or optimizer step
    (``p2ptrain.peers.sample_account``).
    ``manifest_hash`` identifies the settings it trains with, ``version`` the
    p2ptrain version, ``reachability`` whether others dial it directly (measured,
    ``peers.reachability``), and
    ``time`` is the DHT time of the measurement.
    """

    model_config = pydantic.ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)

    peer_id: str = pydantic.Field(min_length=1, max_length=128)
    nickname: str = pydantic.Field("", max_length=64)
    device: str = pydantic.Field("cpu", max_length=128)
    precision: str = pydantic.Field("fp32", max_length=32)
    quantization: str = pydantic.Field("none", max_length=32)
    micro_batch: int = pydantic.Field(0, ge=0)
    samples_per_second: float = pydantic.Field(0.0, ge=0)
    loss: float | None = None
    epoch: int = pydantic.Field(0, ge=0)
    trained_samples: int = pydantic.Field(0, ge=0)
    contributed_samples: int = pydantic.Field(0, ge=0)
    manifest_hash: str = pydantic.Field("", max_length=64)
    version: str = pydantic.Field("", max_length=32)
    reachability: Literal["direct", "relayed", "unreachable", "unknown"] = "unknown"
    time: float = pydantic.Field(0.0, ge=0)

    @pydantic.field_validator("loss", mode="before")
    @classmethod
    def _finite_loss_or_none(cls, value):
        # A diverged step must not make the whole record unpublishable.
        if isinstance(value, float) and not math.isfinite(value):
            return None
        return value


def publish_metrics(dht, run_id: str, metrics: LocalMetrics, expiration_s: float = METRICS_EXPIRATION_S) -> bool:
    """Publish this peer's metrics for ``run_id``, signed under its own public key.

    :param expiration_s: the record vanishes after this many seconds unless
        republished; publish at least twice per period to stay visible.
    :returns: whether the DHT accepted the record (False e.g. when no peer
        answered; the next publish retries, so callers usually just log it).
    """
    from hivemind.utils import get_dht_time

    from p2ptrain.peers.dht import follow_run, own_public_key
    from p2ptrain.peers.local_reads import store_record

    follow_run(dht, run_id)
    stored = store_record(dht, metrics_key(run_id), own_public_key(dht), metrics.model_dump(mode="json"),
                          get_dht_time() + expiration_s)
    if not stored:
        logger.warning("the DHT did not accept this peer's metrics for run %s", run_id)
    return bool(stored)


def withdraw_metrics(dht, run_id: str, expiration_s: float = METRICS_EXPIRATION_S) -> bool:
    """Say goodbye: replace this peer's metrics with an empty entry, so readers drop it at once.

    A record with a *shorter* life cannot replace ours (the DHT keeps the entry
    that expires last), so an empty entry that outlives the last published
    record is stored instead; ``expiration_s`` must be at least the one used
    by :func:`publish_metrics`.

    :returns: whether the DHT accepted it.
    """
    from hivemind.utils import get_dht_time

    from p2ptrain.peers.dht import follow_run, own_public_key
    from p2ptrain.peers.local_reads import store_record

    follow_run(dht, run_id)
    stored = store_record(dht, metrics_key(run_id), own_public_key(dht), None, get_dht_time() + expiration_s)
    return bool(stored)


def read_metrics(dht, run_id: str) -> list[LocalMetrics]:
    """Every peer's current metrics for ``run_id``: from this peer's own copy once it holds every
    record, else the newest state the DHT's nodes have (``local_reads.read_record``).

    Records that fail the schema, or whose ``peer_id`` is not the one of the
    key they are signed with, are logged and dropped. Signatures are checked
    when a record reaches this peer (the RSASignatureValidator that
    :func:`p2ptrain.peers.dht.start_dht` installs), so no record under another
    peer's key without its signature gets here; the other checks are repeated
    here because this peer's own storage may hold records it accepted before
    it followed the run.
    """
    from hivemind.dht.protocol import DHTProtocol

    from p2ptrain.peers.dht import follow_run
    from p2ptrain.peers.local_reads import read_record
    from p2ptrain.peers.validators import owner_peer_id

    follow_run(dht, run_id)
    found = read_record(dht, metrics_key(run_id))
    if found is None or not isinstance(found.value, dict):
        return []
    peers = []
    for subkey, entry in found.value.items():
        if entry.value is None:
            continue
        try:
            metrics = LocalMetrics.model_validate(entry.value, strict=True)
        except pydantic.ValidationError as error:
            logger.warning("dropped a metrics record of run %s: %s", run_id, str(error).replace("\n", " "))
            continue
        signer = owner_peer_id(DHTProtocol.serializer.dumps(subkey))
        if signer != metrics.peer_id:
            logger.warning(
                "dropped a metrics record of run %s claiming peer %s, signed by %s", run_id, metrics.peer_id, signer
            )
            continue
        peers.append(metrics)
    return sorted(peers, key=lambda metrics: metrics.peer_id)
