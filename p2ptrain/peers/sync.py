"""Synchronous data-parallel training: hivemind.Optimizer over the trainable parameters.

Every peer accumulates gradients toward a shared ``target_batch_size``; when the
swarm has gathered that many samples, the peers average their gradients in one
all-reduce and take one AdamW step together. That is one epoch.

The hivemind progress record is ``{averaging_prefix(manifest)}_progress`` (the
optimizer's ``run_id`` is the averaging prefix), which is what ``swarm.read_swarm``
reads. DiLoCo (``diloco.py``) publishes under the same key.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Sequence

import hivemind
import numpy as np
import torch
from hivemind.averaging import DecentralizedAverager
from hivemind.optim.grad_averager import GradientAverager
from hivemind.compression import (
    BlockwiseQuantization,
    CompressionBase,
    Float16Compression,
    NoCompression,
    Quantile8BitQuantization,
    Uniform8BitQuantization,
)
from hivemind.compression import serialization as hivemind_serialization
from hivemind.proto import runtime_pb2
from hivemind.optim.state_averager import TrainingStateAverager

from p2ptrain.peers.checkpoint import state_problem
from p2ptrain.peers.optimizers import make_optimizer, make_scheduler
from p2ptrain.peers.progress import QuietProgressTracker
from p2ptrain.peers.round_loss import CountsLostParts, found_no_group

logger = logging.getLogger(__name__)

# Averaging timings. On 127.0.0.1 groups form in well under a second; over the
# internet peers need several seconds to find each other and to stream tensors.
LOCAL_AVERAGING = {"matchmaking_time": 3.0, "averaging_timeout": 30.0}
INTERNET_AVERAGING = {"matchmaking_time": 15.0, "averaging_timeout": 120.0}


@dataclasses.dataclass
class StepOutcome:
    """What one call to a trainer's ``step``/``tick`` changed.

    epoch_advanced: the local epoch moved forward (an outer / global step happened).
    averaged_with: peers in the averaging round that finished, this one included,
        or None if no round finished since the last outcome.
    loaded_state: state was downloaded from peers (this peer was behind).
    non_finite_average: peers in an averaging round whose result held NaN or
        infinity and was not adopted (this peer stepped on its own values), or None.
    failed_rounds: averaging rounds that formed no group in time since the last outcome.
    averaged_share: the share of the ``averaged_with`` round's values that were really averaged
        (below 1.0 when a peer dropped out mid-round: the rest kept this peer's own values;
        ``peers.round_loss``).
    failed_exchanges: rounds since the last outcome whose group formed but whose data exchange failed.
    """

    epoch_advanced: bool = False
    averaged_with: int | None = None
    loaded_state: bool = False
    non_finite_average: int | None = None
    failed_rounds: int = 0
    averaged_share: float = 1.0
    failed_exchanges: int = 0

    def non_finite_message(self) -> str | None:
        """The event message for a rejected round, or None if there was none."""
        if self.non_finite_average is None:
            return None
        return f"averaging with {self.non_finite_average} peers gave non-finite values; kept local state"


def all_finite(tensors: Sequence[torch.Tensor]) -> bool:
    """True if no tensor holds a NaN or an infinity."""
    return all(bool(torch.isfinite(tensor).all()) for tensor in tensors)


class NonFiniteAverage(Exception):
    """An averaging round gave NaN or infinity: a peer sent broken values."""


def averaging_timings(spec_averaging: dict | None, host_maddrs: Sequence[str] = ()) -> dict:
    """Pick matchmaking_time / averaging_timeout: the spec's values win, else
    fast ones for a swarm on loopback, else internet-friendly ones."""
    on_loopback = bool(host_maddrs) and all("/127.0.0.1/" in address or "/::1/" in address for address in host_maddrs)
    timings = dict(LOCAL_AVERAGING if on_loopback else INTERNET_AVERAGING)
    timings.update({key: float(value) for key, value in (spec_averaging or {}).items() if key in timings})
    return timings


def _int64_at(buffer: bytes, offset: int = 0) -> int:
    return int(np.frombuffer(buffer, count=1, offset=offset, dtype=np.int64)[0])


class _CodebookExtract:
    """hivemind 1.1's ``Quantization.extract`` calls ``int()`` on a 1-element array,
    which numpy >= 2.4 refuses ("only 0-dimensional arrays..."): every 8-bit
    tensor a peer received failed. This is the same decoding with the header read
    as a scalar."""

    def extract(self, serialized_tensor: runtime_pb2.Tensor) -> torch.Tensor:
        buffer = serialized_tensor.buffer
        codebook = np.frombuffer(buffer, offset=8, count=_int64_at(buffer), dtype=self.codebook_dtype)
        quantized = np.frombuffer(buffer, offset=8 + codebook.nbytes, dtype=self.indices_dtype)
        quantized = torch.as_tensor(quantized, dtype=torch.int64).reshape(tuple(serialized_tensor.size))
        codebook = torch.as_tensor(codebook).to(dtype=getattr(torch, serialized_tensor.dtype))
        return codebook[quantized].requires_grad_(serialized_tensor.requires_grad)


class Uniform8Bit(_CodebookExtract, Uniform8BitQuantization):
    """hivemind's uniform 8-bit quantization, readable under numpy >= 2.4."""


class Quantile8Bit(_CodebookExtract, Quantile8BitQuantization):
    """hivemind's quantile 8-bit quantization, readable under numpy >= 2.4."""


class Blockwise8Bit(BlockwiseQuantization):
    """hivemind's blockwise 8-bit quantization (bitsandbytes), readable under numpy >= 2.4."""

    def extract(self, serialized_tensor: runtime_pb2.Tensor) -> torch.Tensor:
        from bitsandbytes.functional import dequantize_blockwise
        from hivemind.compression.quantization import _BLOCKWISE_QUANTIZATION_BLOCKSIZE

        buffer = serialized_tensor.buffer
        absmax = np.frombuffer(buffer, offset=16, count=_int64_at(buffer), dtype=self.codebook_dtype)
        codebook = np.frombuffer(buffer, offset=16 + absmax.nbytes, count=_int64_at(buffer, 8), dtype=self.codebook_dtype)
        quantized = np.frombuffer(buffer, offset=16 + absmax.nbytes + codebook.nbytes, dtype=self.indices_dtype)
        result = dequantize_blockwise(
            torch.as_tensor(quantized).reshape(tuple(serialized_tensor.size)), absmax=torch.as_tensor(absmax),
            code=torch.as_tensor(codebook), blocksize=_BLOCKWISE_QUANTIZATION_BLOCKSIZE, nested=False,
        )
        return result.to(getattr(torch, serialized_tensor.dtype)).requires_grad_(serialized_tensor.requires_grad)


# hivemind decodes every received tensor through this registry (in the averager
# processes, which are forked after this import)
hivemind_serialization._BASE_COMPRESSION_TYPES.update(
    UNIFORM_8BIT=Uniform8Bit(), QUANTILE_8BIT=Quantile8Bit(), BLOCKWISE_8BIT=Blockwise8Bit()
)


def make_compression(name: str, tensors: Sequence[torch.Tensor]) -> CompressionBase:
    """The hivemind compression for the manifest's ``compression`` name.

    Float16Compression refuses bfloat16 tensors; bf16 is already two bytes a
    value, so bf16 tensors are sent as they are.
    """
    if name == "fp16":
        if any(tensor.dtype == torch.bfloat16 for tensor in tensors):
            logger.info("Sending bfloat16 tensors uncompressed: they are already 16-bit")
            return NoCompression()
        return Float16Compression()
    if name == "uniform8bit":
        return Uniform8Bit()
    if name == "blockwise8bit":
        return Blockwise8Bit()
    if name == "none":
        return NoCompression()
    raise ValueError(f"unknown compression {name!r}: use none, fp16, uniform8bit or blockwise8bit")


class CheckedStateMixin(DecentralizedAverager):
    """Refuses state downloaded from a peer unless every tensor is finite and
    shapes match ours (a broken or malicious peer must not poison this one)."""

    rejected_states = 0

    def load_state_from_peers(self, wait: bool = True, timeout: float | None = None):
        loaded = super().load_state_from_peers(wait=wait, timeout=timeout)
        if loaded is None or not wait:
            return loaded
        metadata, received = loaded
        _, expected, _ = self.get_current_state()
        problem = state_problem(expected, received)
        if problem is not None:
            self.rejected_states += 1
            logger.warning("Refusing state downloaded from a peer: %s", problem)
            return None
        return loaded


class CheckedTrainingStateAverager(TrainingStateAverager, CheckedStateMixin):
    """hivemind's TrainingStateAverager with downloaded state checked first,
    and averaged parameters and statistics adopted only when all finite."""

    rejected_averages = 0

    def _apply_averaging_results_(self):
        # hivemind averages into separate buffers (reuse_tensors is off without
        # offloading) and copies them over the local state here
        with self.get_tensors() as averaged:
            finite = all_finite(averaged)
        if not finite:
            self.rejected_averages += 1
            logger.warning("State averaging gave non-finite parameters or statistics: not adopted, local state kept")
            return
        super()._apply_averaging_results_()


class CountingGradientAverager(CountsLostParts, GradientAverager):
    """hivemind's GradientAverager that knows how much of its last round was averaged."""


class SyncOptimizer(hivemind.Optimizer):
    """hivemind.Optimizer that checks downloaded state and remembers the size
    of each finished gradient-averaging round."""

    def __init__(self, *, client_mode: bool = False, **kwargs):
        self._averaging_client = client_mode
        self._finished_groups: list[int] = []
        self._rejected_groups: list[int] = []
        self._failed_rounds = self._failed_exchanges = 0
        self._last_share = 1.0
        self._groups_lock = threading.Lock()
        self._loading_local_gradients = False
        self._round_rejected = False
        super().__init__(client_mode=client_mode, **kwargs)

    def _make_progress_tracker(self, target_batch_size: int, **kwargs):
        # hivemind 1.1's Optimizer replaces a given client_mode with the DHT's (`client_mode if
        # client_mode is None else dht.client_mode`); the tracker is made right after that line and
        # before the averagers, which read self.client_mode: a peer nobody dials directly averages
        # as a client while its DHT still serves
        self.client_mode = self._averaging_client
        return QuietProgressTracker(dht=self.dht, prefix=self.run_id, target_batch_size=target_batch_size,
                                    client_mode=self.client_mode, status_loglevel=self.status_loglevel, start=True,
                                    **kwargs)

    def _make_state_averager(self, **kwargs) -> TrainingStateAverager:
        return CheckedTrainingStateAverager(
            dht=self.dht,
            prefix=f"{self.run_id}_state_averager",
            min_matchmaking_time=self.matchmaking_time,
            allreduce_timeout=self.allreduce_timeout,
            shutdown_timeout=self.shutdown_timeout,
            offload_optimizer=self.offload_optimizer,
            custom_gradients=self.offload_optimizer,
            status_loglevel=self.status_loglevel,
            next_chunk_timeout=self.next_chunk_timeout,
            client_mode=self.client_mode,
            auxiliary=self.auxiliary,
            start=True,
            **kwargs,
        )

    def _average_gradients_and_load_into_optimizer(self, maybe_step_control):
        self._round_rejected = False
        super()._average_gradients_and_load_into_optimizer(maybe_step_control)
        # the real group size comes from hivemind's round result (GroupInfo-keyed dict)
        if maybe_step_control is None:
            return  # no other peer: nothing was attempted
        group, error = None, None
        if maybe_step_control.done() and not maybe_step_control.cancelled():
            try:
                group = maybe_step_control.result(0)
            except BaseException as raised:  # hivemind already fell back to the local gradients
                error = raised
        with self._groups_lock:
            if group:
                (self._rejected_groups if self._round_rejected else self._finished_groups).append(len(group))
                self._last_share = self.grad_averager.received_share()
            elif error is not None and not found_no_group(error):
                self._failed_exchanges += 1
            else:
                self._failed_rounds += 1

    def _load_averaged_gradients_into_optimizer_(self):
        # raising here makes hivemind fall back to the local gradients, as after a
        # failed round; the fallback loads them through this method too
        if not self._loading_local_gradients:
            with self.grad_averager.get_tensors() as averaged:
                finite = all_finite(averaged)
            if not finite:
                self._round_rejected = True
                logger.warning("Gradient averaging gave non-finite values: not adopted, stepping with local gradients")
                raise NonFiniteAverage("averaged gradients hold NaN or infinity")
        super()._load_averaged_gradients_into_optimizer_()

    def _load_local_gradients_into_optimizer(self):
        self._loading_local_gradients = True
        try:
            super()._load_local_gradients_into_optimizer()
        finally:
            self._loading_local_gradients = False

    def pop_finished_groups(self) -> tuple[list[int], list[int], int]:
        """Gradient-averaging rounds finished since the last call: sizes of the
        adopted and of the rejected (non-finite) ones, and how many found no group."""
        with self._groups_lock:
            groups, self._finished_groups = self._finished_groups, []
            rejected, self._rejected_groups = self._rejected_groups, []
            failed, self._failed_rounds = self._failed_rounds, 0
        return groups, rejected, failed

    def pop_exchange_outcome(self) -> tuple[float, int]:
        """The averaged share of the last finished round, and the rounds since the last call
        whose group formed but whose data exchange failed."""
        with self._groups_lock:
            failed, self._failed_exchanges = self._failed_exchanges, 0
            return self._last_share, failed


class SyncTrainer:
    """Trains the trainable parameters in sync mode with a hivemind.Optimizer.

    Args:
        dht: the running hivemind DHT.
        prefix: ``averaging_prefix(manifest)``; peers average only within it.
        parameters: the trainable parameters (only these are averaged).
        target_batch_size: samples the whole swarm gathers per epoch.
        batch_size_per_step: samples this peer contributes per ``step``
            (micro_batch * grad_accum).
        inner_lr: the optimizer's base learning rate.
        compression: manifest compression name, used for gradients and state.
        matchmaking_time: seconds peers spend forming an averaging group.
        averaging_timeout: seconds before a stuck averaging round is abandoned.
        client_mode: this peer cannot accept connections (behind NAT, no relay).
        optimizer: "adamw" or "lamb" (see ``p2ptrain.peers.optimizers``).
        warmup_epochs, lr_schedule, total_epochs: the learning rate per global
            epoch (``optimizers.learning_rate_factor``).
    """

    def __init__(
        self,
        *,
        dht: hivemind.DHT,
        prefix: str,
        parameters: Sequence[torch.nn.Parameter],
        target_batch_size: int,
        batch_size_per_step: int,
        inner_lr: float,
        compression: str,
        matchmaking_time: float,
        averaging_timeout: float,
        client_mode: bool = False,
        optimizer: str = "adamw",
        warmup_epochs: int = 0,
        lr_schedule: str = "constant",
        total_epochs: int | None = None,
    ):
        self.parameters = list(parameters)
        compressor = make_compression(compression, self.parameters)
        optimizer_name = optimizer
        self.optimizer = SyncOptimizer(
            dht=dht,
            run_id=prefix,
            target_batch_size=target_batch_size,
            batch_size_per_step=batch_size_per_step,
            params=self.parameters,
            optimizer=lambda params: make_optimizer(optimizer_name, params, lr=inner_lr),
            # stepped by hivemind once per global epoch, so all peers share one learning rate
            scheduler=make_scheduler(warmup_epochs, lr_schedule, total_epochs),
            matchmaking_time=matchmaking_time,
            averaging_timeout=averaging_timeout,
            # hivemind's default (the matchmaking time: 3 s on a LAN) drops a peer that is busy for 3 s
            # between two parts of a round, and the round comes back partly unaveraged
            next_chunk_timeout=averaging_timeout / 4,
            load_state_timeout=max(averaging_timeout, 30.0),
            grad_compression=compressor,
            state_averaging_compression=compressor,
            # separate accumulators, so a batch with non-finite gradients can be
            # dropped before it reaches them (see skip_batch)
            reuse_grad_buffers=False,
            grad_averager_factory=CountingGradientAverager,
            client_mode=client_mode,
            # hivemind warns (and can deadlock) when a request may outlive matchmaking
            averager_opts={"request_timeout": min(3.0, matchmaking_time / 2)},
            verbose=logger.isEnabledFor(logging.DEBUG),
        )
        self.tracker = self.optimizer.tracker
        self._state_rejections_seen = 0

    @property
    def local_epoch(self) -> int:
        return self.optimizer.local_epoch

    def wants_batch(self) -> bool:
        """Sync mode always takes the next batch."""
        return True

    def is_behind(self) -> bool:
        """True when the swarm is more than one epoch ahead (state must be downloaded)."""
        return self.optimizer.local_epoch < self.optimizer.tracker.global_epoch - 1

    def step(self, samples: int) -> StepOutcome:
        """Account for one local batch whose gradients are in ``.grad``."""
        epoch_before = self.local_epoch
        self.optimizer.step(batch_size=samples)
        self.optimizer.zero_grad(set_to_none=True)
        return self._outcome(epoch_before)

    def tick(self) -> StepOutcome:
        """Collect results of background rounds (nothing to drive in sync mode)."""
        return self._outcome(self.local_epoch)

    def _outcome(self, epoch_before: int) -> StepOutcome:
        groups, rejected, failed = self.optimizer.pop_finished_groups()
        state_rejections = self.optimizer.state_averager.rejected_averages
        if state_rejections > self._state_rejections_seen and not rejected:
            # hivemind does not hand out the state round's group: the peers in the run bound it
            rejected = [max(self.tracker.global_progress.num_peers, 2)]
        self._state_rejections_seen = state_rejections
        share, failed_exchanges = self.optimizer.pop_exchange_outcome()
        return StepOutcome(
            epoch_advanced=self.local_epoch > epoch_before,
            averaged_with=groups[-1] if groups else None,
            loaded_state=self.local_epoch > epoch_before + 1,
            non_finite_average=rejected[-1] if rejected else None,
            failed_rounds=failed,
            averaged_share=share if groups else 1.0,
            failed_exchanges=failed_exchanges,
        )

    def skip_batch(self) -> None:
        """Discard gradients of a batch that must not be contributed."""
        for parameter in self.parameters:
            parameter.grad = None

    def set_idle(self, idle: bool) -> None:
        """While this peer does not train: drop the averaging rounds hivemind scheduled ahead (a paused peer
        that stays in a round's matchmaking floods the swarm with join requests, ~150 packets/s measured in
        the network lab) and read the swarm's progress rarely. hivemind schedules again at the next step."""
        if idle:
            for name in ("scheduled_grads", "scheduled_state"):
                control = getattr(self.optimizer, name)
                if control is not None and not control.done():
                    control.cancel()
                setattr(self.optimizer, name, None)
        self.tracker.set_idle(idle)

    def load_state_from_peers(self) -> bool:
        """Download the newest state from the swarm; True if the epoch moved."""
        epoch_before = self.local_epoch
        self.optimizer.load_state_from_peers()
        return self.local_epoch != epoch_before

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "epoch": self.local_epoch}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.optimizer.state_averager.local_epoch = int(state["epoch"])
        # hivemind moves the schedule only when an epoch ends: bring it to the restored epoch now
        self.optimizer.state_averager._update_scheduler()
        self.optimizer.tracker.report_local_progress(self.local_epoch, 0)

    def shutdown(self) -> None:
        self.optimizer.shutdown()
