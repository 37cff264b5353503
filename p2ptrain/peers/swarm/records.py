"""Per-peer metrics records: what each peer in a run says about itself.

Every peer publishes a :class:`LocalMetrics` under the DHT key
``{run_id}_metrics`` (past 32 peers ``{run_id}_{S}.{i}_metrics``, its shard of
the progress records: :func:`metrics_key`), subkey = its own public key
(``identity``), signed. The key uses the
plain run id (not the averaging prefix) so peers with another manifest are
still seen, marked incompatible by their ``manifest_hash``.

The format alone (pydantic only); publishing and reading the records is
``run_records.py``'s.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import pydantic

METRICS_EXPIRATION_S = 90.0  # the worker writes its record every 30 s
# Bounds on what a record may claim: anyone may publish one in a run.
MAX_GROUP = 100_000
MAX_BANS = 64
PeerId = Annotated[str, pydantic.StringConstraints(min_length=1, max_length=128)]
FIELDS_SINCE_FORMAT_5 = frozenset({"last_group", "bans"})


# the most shards a run's records are kept in (``progress_shards``; 32,768 peers at 32 a shard): a validator knows
# the keys of every layout up to it
MAX_SHARDS = 1024


def metrics_key(run_id: str, shards: int = 1, shard: int = 0) -> str:
    """The DHT key under which a run's per-peer metrics live: shard ``shard`` of ``shards`` (one: the run's own key).
    Past 32 peers the records are in the progress records' shards, each peer's in its own (``progress_shards``)."""
    return f"{run_id}_metrics" if shards == 1 else f"{run_id}_{shards}.{shard}_metrics"


def every_metrics_key(run_id: str) -> list[str]:
    """The metrics keys of every layout of shards up to :data:`MAX_SHARDS`."""
    keys, shards = [], 1
    while shards <= MAX_SHARDS:
        keys += [metrics_key(run_id, shards, shard) for shard in range(shards)]
        shards *= 2
    return keys


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
    (``p2ptrain.peers.training.sample_account``).
    ``manifest_hash`` identifies the settings it trains with, ``version`` the
    p2ptrain version, ``reachability`` whether others dial it directly (measured,
    ``peers.net.reachability``), and
    ``time`` is the DHT time of the measurement.

    From manifest format 5 on (:data:`FIELDS_SINCE_FORMAT_5`): ``last_group``, the peers
    in its last averaging round, itself included (0 before its first), and
    ``bans``, the peer ids it refuses to average with (``peers/robust/trust.py``).
    A peer that runs an older format refuses a record with fields it does not
    know, so :func:`record_for_format` leaves them out of the records of an older run.
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
    last_group: int = pydantic.Field(0, ge=0, le=MAX_GROUP)
    bans: list[PeerId] = pydantic.Field(default_factory=list, max_length=MAX_BANS)

    @pydantic.field_validator("loss", mode="before")
    @classmethod
    def _finite_loss_or_none(cls, value):
        # A diverged step must not make the whole record unpublishable.
        if isinstance(value, float) and not math.isfinite(value):
            return None
        return value


def record_for_format(metrics: LocalMetrics, manifest_format: int) -> dict:
    """The record to publish for a run whose manifest is of ``manifest_format``: the fields its peers know."""
    return metrics.model_dump(mode="json", exclude=FIELDS_SINCE_FORMAT_5 if manifest_format < 5 else None)
