"""The run manifest: what a training run is, defined once by its creator.

A volunteer needs only a run id and one bootstrap address: every other setting
(model, data, batch sizes, learning rates, compression) is read from the
manifest its creator published in the DHT under ``p2ptrain/{run_id}/manifest``.

This module is the format alone (pydantic only), so the daemon can validate a
manifest before it starts a training worker; reading and publishing it in the
DHT is ``run_records.py``'s.

Conflicts: if several peers published *different* manifests under one run id,
the one with the earliest ``created_at`` wins (ties broken by the smaller
hash) and the others are logged as warnings. Peers that adopt the winner
republish it under their own key, so the run stays joinable after its creator
leaves; ``run_records.publish_manifest`` refuses to create a second, different
run under a name that is already taken.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from typing import Any, Literal

import pydantic

from p2ptrain.peers.compression.ladder import RUNG_HELP, allowed_rungs, parse_rung
from p2ptrain.peers.swarm.outer_step import DEFAULT_OUTER_LR, DEFAULT_OUTER_MOMENTUM, PAPER_OUTER_LR, PAPER_OUTER_MOMENTUM

RUN_ID_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}$"
MANIFEST_EXPIRATION_S = 7 * 24 * 3600
# bumped whenever a field is added or its meaning changes: a peer refuses a
# manifest of a newer format with "upgrade p2ptrain" rather than "unknown field".
# 2: warmup_epochs, lr_schedule and total_epochs also schedule DiLoCo's inner lr
# 3: DiLoCo rounds end on the swarm's samples by default (round_end, round_time_limit_s); sparse
#    compression rungs, compression_rungs and error_feedback_decay
# 4: DiLoCo's outer step defaults to lr 1.0 without momentum (peers/swarm/outer_step.py says why)
# 5: the peers' metrics records carry last_group and bans (peers/swarm/records.py: a peer of an older
#    format refuses a record with fields it does not know, so only runs of format 5 get them)
MANIFEST_FORMAT = 5

# What to tell a user whose value for a field was refused.
_FIXES = {
    "run_id": "use 1-64 characters: lowercase letters, digits, '.', '_' or '-', starting with a letter or digit",
    "mode": "use 'sync' or 'diloco'",
    "model": "name a preset (e.g. 'tiny'), a hub id or a local path",
    "lora": "give {r, alpha, dropout, target_modules} or null for full training",
    "lora.r": "use a whole-number rank between 1 and 4096, e.g. 8",
    "lora.alpha": "use a number > 0, e.g. 16",
    "lora.dropout": "use a number in [0, 1), e.g. 0.05",
    "lora.target_modules": "give a list of module names, e.g. [\"q_proj\", \"v_proj\"], or null",
    "dataset": "give a dict with a 'kind' string, e.g. {\"kind\": \"stdlib\"}",
    "seq_len": "use a whole number of tokens between 1 and 1048576",
    "target_batch_size": "use a whole number of samples >= 1",
    "local_steps": "use a whole number of inner steps >= 1",
    "round_end": "use 'samples' (a round ends when the swarm trained target_batch_size samples) or 'local_steps' (after H inner steps on every peer)",
    "round_time_limit_s": "use a number of seconds > 0, or leave it out (rounds end on samples only)",
    "micro_batch_hint": "use a whole number >= 1",
    "inner_lr": "use a finite number > 0, e.g. 0.001",
    "outer_lr": "use a finite number > 0, e.g. 1.0",
    "outer_momentum": "use a number in [0, 1), e.g. 0 (none)",
    "compression": RUNG_HELP,
    "compression_rungs": "list cheaper rungs than compression, e.g. [\"sparse2bit-64of4096\"], or leave it out",
    "error_feedback_decay": "use a number in (0, 1], e.g. 1.0 (carry everything not sent into the next round)",
    "optimizer": "use 'adamw' or 'lamb'",
    "warmup_epochs": "use a whole number of epochs >= 0",
    "lr_schedule": "use 'constant', 'cosine' or 'linear'",
    "total_epochs": "use a whole number of epochs >= 1 (the cosine and linear schedules decay to 0 there), or leave it out",
    "seed": "use a whole number >= 0",
    "created_at": "leave it out: new_manifest sets it",
}


class ManifestError(ValueError):
    """A manifest that cannot be used, with a one-line ``message`` and a ``fix``."""

    def __init__(self, message: str, fix: str):
        super().__init__(f"{message}; {fix}")
        self.message = message
        self.fix = fix


class LoraSpec(pydantic.BaseModel):
    """LoRA adapters: rank ``r``, scale ``alpha``, ``dropout``, and which modules get them (None: peft's default)."""

    model_config = pydantic.ConfigDict(extra="forbid", allow_inf_nan=False)

    r: int = pydantic.Field(8, ge=1, le=4096)
    alpha: float = pydantic.Field(16.0, gt=0)
    dropout: float = pydantic.Field(0.05, ge=0, lt=1)
    target_modules: list[str] | None = None


class Manifest(pydantic.BaseModel):
    """Everything peers must agree on to train together.

    ``run_id`` names the run; ``mode`` is ``sync`` (hivemind.Optimizer, an epoch
    is ``target_batch_size`` samples across all peers) or ``diloco`` (each peer
    takes ``local_steps`` inner AdamW steps at ``inner_lr``, then the averaged
    pseudo-gradient is applied by an outer Nesterov SGD with ``outer_lr`` and
    ``outer_momentum``). A DiLoCo round (``round_end``) ends when the swarm
    trained ``target_batch_size`` samples in it (``samples``: every peer trains
    until then, fast ones more inner steps, nobody waits; also after
    ``round_time_limit_s`` seconds when given) or after ``local_steps`` inner
    steps on every peer (``local_steps``: the paper's setting, for equal
    hardware); ``local_steps`` also sets the unit of the inner learning rate's
    schedule (see ``p2ptrain.peers.training.diloco_rounds``). ``model`` is a preset name, hub id or path; ``lora`` is
    null for full training. ``micro_batch_hint`` is only a starting point for
    the hardware plan. ``compression`` applies to averaged tensors: the run's
    top rung of the compression ladder (``compression_ladder``; sparse rungs
    in ``diloco`` mode only), the most a peer sends; ``compression_rungs``
    lists cheaper rungs a peer on a slow uplink may send instead, and
    ``error_feedback_decay`` is the share of what a peer did not send on a
    sparse rung that it carries into the next round. ``optimizer``
    (``adamw`` or ``lamb``), ``warmup_epochs``, ``lr_schedule`` and
    ``total_epochs`` set the sync optimizer's learning rate per global epoch;
    DiLoCo's inner optimizer is AdamW, whose ``inner_lr`` follows the same
    warm-up and schedule counted in inner steps (an epoch is ``local_steps``
    of them). ``seed``
    fixes initial weights and data order; ``created_at`` is when the run was
    defined (seconds since the epoch). ``format`` is the manifest format the
    creator's p2ptrain wrote (:data:`MANIFEST_FORMAT`).
    """

    model_config = pydantic.ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)

    format: int = pydantic.Field(MANIFEST_FORMAT, ge=1, le=MANIFEST_FORMAT)
    run_id: str = pydantic.Field(pattern=RUN_ID_PATTERN)
    mode: Literal["sync", "diloco"] = "sync"
    model: str = pydantic.Field("tiny", min_length=1, max_length=512)
    lora: LoraSpec | None = None
    dataset: dict[str, Any] = pydantic.Field(default_factory=lambda: {"kind": "stdlib"})
    seq_len: int = pydantic.Field(128, ge=1, le=1 << 20)
    target_batch_size: int = pydantic.Field(256, ge=1)
    local_steps: int = pydantic.Field(50, ge=1)
    round_end: Literal["samples", "local_steps"] = "samples"
    round_time_limit_s: float | None = pydantic.Field(None, gt=0)
    micro_batch_hint: int = pydantic.Field(8, ge=1)
    inner_lr: float = pydantic.Field(1e-3, gt=0)
    outer_lr: float = pydantic.Field(DEFAULT_OUTER_LR, gt=0)
    outer_momentum: float = pydantic.Field(DEFAULT_OUTER_MOMENTUM, ge=0, lt=1)
    compression: str = "none"
    compression_rungs: list[str] = pydantic.Field(default_factory=list)
    error_feedback_decay: float = pydantic.Field(1.0, gt=0, le=1)
    optimizer: Literal["adamw", "lamb"] = "adamw"
    warmup_epochs: int = pydantic.Field(0, ge=0)
    lr_schedule: Literal["constant", "cosine", "linear"] = "constant"
    total_epochs: int | None = pydantic.Field(None, ge=1)
    seed: int = pydantic.Field(0, ge=0)
    created_at: float = pydantic.Field(0.0, ge=0)

    @pydantic.field_validator("dataset")
    @classmethod
    def _dataset_has_kind(cls, value: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(value.get("kind"), str) or not value["kind"]:
            raise ValueError("the dataset spec needs a 'kind' string")
        # The spec travels through the DHT and into the hash: it must be plain JSON.
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as error:
            raise ValueError(f"the dataset spec is not plain JSON ({error})") from None
        return value

    @pydantic.field_validator("compression")
    @classmethod
    def _compression_is_a_rung(cls, value: str) -> str:
        return parse_rung(value).name

    @pydantic.model_validator(mode="after")
    def _rungs_fit_the_mode(self) -> "Manifest":
        rungs = allowed_rungs(self.compression, self.compression_rungs)
        sparse = [rung.name for rung in rungs if rung.sparse]
        if sparse and self.mode != "diloco":
            raise ValueError(f"compression {sparse[0]} sends sparse pseudo-gradients, which only mode 'diloco' has; "
                             f"use mode 'diloco', or a dense compression (none, fp16, blockwise8bit)")
        return self

    @pydantic.model_validator(mode="before")
    @classmethod
    def _older_formats_keep_their_defaults(cls, data: Any) -> Any:
        # a run defined before format 3 ended every DiLoCo round after local_steps inner steps, and
        # before format 4 had the DiLoCo paper's outer step by default
        if isinstance(data, dict) and isinstance(data.get("format"), int) and data["format"] < 4:
            old = {"outer_lr": PAPER_OUTER_LR, "outer_momentum": PAPER_OUTER_MOMENTUM}
            if data["format"] < 3:
                old["round_end"] = "local_steps"
            data = {**old, **data}
        return data

    @pydantic.model_validator(mode="after")
    def _decaying_schedule_has_an_end(self) -> "Manifest":
        if self.lr_schedule != "constant" and self.total_epochs is None:
            raise ValueError(f"lr_schedule {self.lr_schedule!r} needs total_epochs; give total_epochs (where the "
                             f"rate reaches 0) or use lr_schedule 'constant'")
        if self.total_epochs is not None and self.total_epochs <= self.warmup_epochs and self.lr_schedule != "constant":
            raise ValueError(f"total_epochs {self.total_epochs} leaves no epoch after {self.warmup_epochs} warm-up "
                             f"epochs; give total_epochs greater than warmup_epochs")
        return self

    def manifest_hash(self) -> str:
        """The first 16 hex digits of the sha256 of the canonical JSON of every field."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), allow_nan=False)
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _error_from_validation(error: pydantic.ValidationError) -> ManifestError:
    first = error.errors()[0]
    location = [str(part) for part in first["loc"]]
    field = location[0] if location else "manifest"
    name = ".".join(location) or "manifest"
    if first["type"] == "extra_forbidden":
        return ManifestError(
            f"manifest field {name!r} is unknown",
            f"remove it; known fields: {', '.join(Manifest.model_fields)}",
        )
    if first["type"] == "missing":
        return ManifestError(f"manifest field {name!r} is missing", _FIXES.get(name, _FIXES.get(field, "give a value")))
    if not location and first["type"] == "value_error":
        # a check across fields: its message is "what is wrong; how to fix it"
        message, _, fix = first["msg"].removeprefix("Value error, ").partition("; ")
        return ManifestError(message, fix or "fix the manifest")
    value = first.get("input")
    shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
    fix = _FIXES.get(name, _FIXES.get(field, first["msg"]))
    return ManifestError(f"manifest field {name!r} = {shown} is invalid", fix)


def parse_manifest(data: dict) -> Manifest:
    """Check a manifest read from the DHT, a file or the control protocol.

    :param data: the manifest as a dict of plain JSON values.
    :raises ManifestError: naming the first bad field, its value and how to fix it.
    """
    if not isinstance(data, dict):
        raise ManifestError(f"a manifest must be an object, not {type(data).__name__}", "give a JSON object")
    written_as = data.get("format", MANIFEST_FORMAT)
    if isinstance(written_as, int) and not isinstance(written_as, bool) and written_as > MANIFEST_FORMAT:
        raise ManifestError(
            f"the run was defined by a newer p2ptrain (manifest format {written_as}; this one reads up to {MANIFEST_FORMAT})",
            "upgrade p2ptrain on this machine: pip install --upgrade p2ptrain",
        )
    try:
        return Manifest.model_validate(data)
    except pydantic.ValidationError as error:
        raise _error_from_validation(error) from None


def new_manifest(run_id: str, **options: Any) -> Manifest:
    """Define a new run: ``run_id`` plus any :class:`Manifest` field to override, stamped with ``created_at`` now.

    :raises ManifestError: naming the first bad field, its value and how to fix it.
    """
    options.setdefault("created_at", time.time())
    return parse_manifest({"run_id": run_id, **options})


def check_run_id(run_id: str) -> str:
    """Return ``run_id`` if it is a valid run name, else raise :class:`ManifestError`."""
    if not isinstance(run_id, str) or not re.match(RUN_ID_PATTERN, run_id):
        raise ManifestError(f"run id {run_id!r} is invalid", _FIXES["run_id"])
    return run_id


def manifest_key(run_id: str) -> str:
    """The DHT key under which a run's manifest lives."""
    return f"p2ptrain/{check_run_id(run_id)}/manifest"


def averaging_prefix_for(run_id: str, manifest_hash: str) -> str:
    """The hivemind prefix of a run's averaging and progress keys; see :func:`averaging_prefix`."""
    return f"{check_run_id(run_id)}-{manifest_hash}"


def averaging_prefix(manifest: Manifest) -> str:
    """The ``run_id`` to give hivemind (Optimizer, averagers, ProgressTracker) for this manifest.

    It is ``f"{run_id}-{manifest_hash}"``: peers whose manifests differ in any
    field land under different hivemind prefixes, so their averagers never
    find each other in matchmaking and their progress never counts towards
    our epochs -- an incompatible peer is never averaged with. Our own
    ``{run_id}_metrics`` records stay under the plain run id, so incompatible
    peers are still *seen* (with ``compatible=False``) in the swarm view.
    hivemind's progress records are therefore under
    ``f"{averaging_prefix(manifest)}_progress"``.
    """
    return averaging_prefix_for(manifest.run_id, manifest.manifest_hash())


def choose_manifest(manifests: list[Manifest]) -> Manifest:
    """The manifest that wins among conflicting ones: earliest ``created_at``, then smallest hash."""
    return min(manifests, key=lambda manifest: (manifest.created_at, manifest.manifest_hash()))
