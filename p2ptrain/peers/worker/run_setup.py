"""Setting up a worker's run from its spec: the DHT, the manifest, the model, the data and the trainer.

``p2ptrain.peers.worker.training_worker`` calls these in order while it joins a run (confirming
its micro-batch with ``calibration`` between the model and the data) and keeps
each part as soon as it is built (so it can shut down what exists if a stop
signal interrupts the rest). Importable without torch or hivemind: they are
imported inside the functions.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from pathlib import Path

from p2ptrain.peers.worker.known_peers import remembered_peers
from p2ptrain.peers.training.trainer import Trainer
from p2ptrain.worker_pipe import WorkerPlan, WorkerSpec

logger = logging.getLogger(__name__)

VALIDATION_BATCHES = 3
UNAVAILABLE_FIX = "use the 'tiny' model and the built-in stdlib dataset, or make the model/data available offline"


class WorkerFailure(Exception):
    """A failure the volunteer can fix: reported as an ``error`` with ``fix``."""

    def __init__(self, message: str, fix: str):
        super().__init__(message)
        self.message, self.fix = message, fix


def stream_seed(manifest_seed: int, peer_id: str) -> int:
    """Each peer reads its own sample stream: the seed mixes the run's seed and the peer id."""
    return int.from_bytes(hashlib.sha256(f"{manifest_seed}:{peer_id}".encode()).digest()[:8], "little")


def join_dht(spec: WorkerSpec, known_peers_file: Path):
    """Start the worker's DHT, with the spec's ``initial_peers`` or else the peers it remembers.

    A run's creator has no bootstrap peers: after a restart it finds its swarm
    again through the peers it was connected to; if none of them answers it
    starts alone.

    Args:
        spec: the worker spec (``initial_peers``, ``dht`` options, ``paths.identity_key``).
        known_peers_file: where the peers of the last checkpoint are remembered.

    Raises:
        WorkerFailure: the DHT did not start.
    """
    from p2ptrain.peers.net.dht import DHTStartError

    initial_peers = list(spec.initial_peers)
    remembered = [] if initial_peers else remembered_peers(known_peers_file)
    try:
        try:
            return _start_dht(spec, initial_peers or remembered)
        except DHTStartError:
            if not remembered:
                raise
            logger.info("None of the %d remembered peers answered: starting alone", len(remembered))
            return _start_dht(spec, initial_peers)
    except DHTStartError as error:
        raise WorkerFailure(error.message, error.fix) from error


def _start_dht(spec: WorkerSpec, initial_peers: list[str]):
    from p2ptrain.peers.net.dht import start_dht

    options = spec.dht
    return start_dht(
        initial_peers,
        Path(spec.paths.identity_key),
        host_maddrs=options.host_maddrs,
        announce_maddrs=options.announce_maddrs,
        use_relay=options.use_relay,
        use_auto_relay=options.use_auto_relay,
        client_mode=options.client_mode,
        start_timeout=options.start_timeout_s,
        check_identity_free=options.check_identity_free,
    )


def run_manifest(spec: WorkerSpec, dht):
    """The run's manifest (the spec's own for a new run, else fetched from the swarm), published again.

    Every peer republishes the manifest, so the run outlives its creator.

    Args:
        spec: the worker spec (``new_run``, ``manifest``, ``run_id``, ``manifest_timeout_s``).
        dht: the worker's running DHT.

    Raises:
        WorkerFailure: the manifest is invalid or no peer has it.
    """
    from p2ptrain.peers.swarm.manifest import ManifestError, parse_manifest
    from p2ptrain.peers.swarm.run_records import fetch_manifest, publish_manifest

    try:
        if spec.new_run:
            manifest = parse_manifest(spec.manifest)
        else:
            manifest = fetch_manifest(dht, spec.run_id, timeout=spec.manifest_timeout_s)
        publish_manifest(dht, manifest)
    except ManifestError as error:
        raise WorkerFailure(error.message, error.fix) from error
    return manifest


def load_model(manifest, device: str, precision: str, quantization: str, gradient_checkpointing: bool = False):
    """Build the run's model (``models.LoadedModel``) on ``device`` as the hardware plan says.

    Args:
        manifest: the run manifest.
        device, precision, quantization, gradient_checkpointing: from the hardware plan
            (``cuda:0``, ``bf16``, ``nf4``...).

    Raises:
        WorkerFailure: the model is unavailable, or the manifest or plan is invalid.
    """
    from p2ptrain.peers.model.models import build_model
    from p2ptrain.peers.model.tokenizers import ModelUnavailable

    try:
        return build_model(manifest.model, manifest.lora.model_dump() if manifest.lora else None, precision, quantization, device,
                           manifest.seed, gradient_checkpointing)
    except ModelUnavailable as error:
        raise WorkerFailure(str(error), UNAVAILABLE_FIX) from error
    except ValueError as error:
        raise WorkerFailure(str(error), "fix the run manifest or the hardware plan") from error


def load_data(manifest, tokenizer, micro_batch: int, peer_id: str, cache_dir: Path, start_position: int):
    """This peer's training batches and the validation batches; returns ``(batches, validation)``.

    Args:
        manifest: the run manifest.
        tokenizer: the model's.
        micro_batch: samples per micro-batch (as confirmed by ``calibration``).
        peer_id: this peer's id (it seeds its sample stream, see ``stream_seed``).
        cache_dir: where datasets are cached.
        start_position: how many training samples to skip (from a checkpoint).

    Raises:
        WorkerFailure: the data is unavailable or too short for the manifest's ``seq_len``.
    """
    from p2ptrain.peers.model.data import DatasetUnavailable, train_batches, validation_batches

    try:
        batches = train_batches(manifest.dataset, tokenizer, manifest.seq_len, micro_batch, stream_seed(manifest.seed, peer_id), cache_dir, start_position)
        validation = validation_batches(manifest.dataset, tokenizer, manifest.seq_len, micro_batch, cache_dir, max_batches=VALIDATION_BATCHES)
    except DatasetUnavailable as error:
        raise WorkerFailure(str(error), UNAVAILABLE_FIX) from error
    except ValueError as error:
        raise WorkerFailure(str(error), "fix the run manifest or the hardware plan") from error
    return batches, validation


def peer_compression(spec: WorkerSpec, plan: WorkerPlan, manifest, trainable_parameters: int) -> str:
    """The rung this peer sends pseudo-gradients with: its plan's, or (a plan that names none) chosen
    now from the spec's ``uplink_mbit_s``, as the daemon's plan chooses it (``compression_ladder.choose_rung``)."""
    from p2ptrain.peers.compression.ladder import ROUND_UPLOAD_S, allowed_rungs, choose_rung

    if plan.compression:
        return plan.compression
    allowed = allowed_rungs(manifest.compression, manifest.compression_rungs)
    rung, reason = choose_rung(allowed, trainable_parameters, spec.uplink_mbit_s, ROUND_UPLOAD_S)
    logger.info("%s", reason)
    return rung.name


def make_trainer(spec: WorkerSpec, plan: WorkerPlan, manifest, dht, parameters, batch_size_per_step: int,
                 averaging_client: bool = False) -> Trainer:
    """The manifest's trainer: ``SyncTrainer``, or in ``diloco`` mode ``SwarmRoundTrainer``
    (``round_end: samples``) or ``DiLoCoTrainer`` (``round_end: local_steps``).

    Its averagers start now and set SIGINT to ignored: install the stop handlers again after.

    Args:
        spec: the worker spec (``dht`` options, ``averaging`` timings, ``banned_peers``).
        plan: the worker's hardware plan (its compression rung).
        manifest: the run manifest.
        dht: the worker's running DHT.
        parameters: the trainable parameters.
        batch_size_per_step: samples of one step (micro-batch times gradient accumulation).
        averaging_client: average as a client (send our share, never reduce), as a DHT
            client always does: other peers cannot dial this one directly (``peers.net.network``).
    """
    from p2ptrain.peers.swarm.manifest import averaging_prefix
    from p2ptrain.peers.robust.matchmaking import install_matchmaking
    from p2ptrain.peers.training.sync import averaging_timings
    from p2ptrain.peers.training.settings import LrSchedule, SwarmSettings
    from p2ptrain.peers.robust.trust import Trust

    install_matchmaking()  # before the averager processes fork

    swarm = SwarmSettings(
        trust=Trust(banned=spec.banned_peers),
        dht=dht, prefix=averaging_prefix(manifest), parameters=parameters,
        target_batch_size=manifest.target_batch_size, batch_size_per_step=batch_size_per_step,
        inner_lr=manifest.inner_lr, compression=manifest.compression,
        client_mode=spec.dht.client_mode or averaging_client,
        **averaging_timings(spec.averaging.to_dict() if spec.averaging else None, spec.dht.host_maddrs),
    )
    schedule = LrSchedule(manifest.warmup_epochs, manifest.lr_schedule, manifest.total_epochs)
    if manifest.mode == "diloco":
        from p2ptrain.peers.compression.ladder import RungNotAllowed, allowed_rungs

        allowed = [rung.name for rung in allowed_rungs(manifest.compression, manifest.compression_rungs)]
        swarm = dataclasses.replace(swarm, compression=peer_compression(spec, plan, manifest, sum(parameter.numel() for parameter in parameters)))
        diloco = dict(local_steps=manifest.local_steps, outer_lr=manifest.outer_lr, outer_momentum=manifest.outer_momentum,
                      allowed_compression=allowed, error_feedback_decay=manifest.error_feedback_decay, schedule=schedule)
        try:
            if manifest.round_end == "local_steps":
                from p2ptrain.peers.training.diloco import DiLoCoTrainer

                return DiLoCoTrainer(swarm, **diloco)
            from p2ptrain.peers.training.diloco_rounds import SwarmRoundTrainer

            return SwarmRoundTrainer(swarm, round_time_limit_s=manifest.round_time_limit_s, **diloco)
        except RungNotAllowed as error:
            raise WorkerFailure(error.message, error.fix) from error
    from p2ptrain.peers.training.sync import SyncTrainer

    return SyncTrainer(swarm, optimizer=manifest.optimizer, schedule=schedule)
