"""DiLoCo: many local steps, then one averaged outer step.

Each peer keeps two copies of the trainable parameters: the *global* ones (on
CPU, identical across the swarm after each outer step) and the *local* ones in
the model. It runs H = ``local_steps`` inner AdamW steps on the local copy,
then computes the pseudo-gradient ``global - local``, averages it with the
compatible peers (a hivemind all-reduce, weighted by the samples each peer
trained on), and applies an outer SGD step with Nesterov momentum to the global
parameters. The local parameters are reset to the new global ones. One outer
step is one epoch. The inner learning rate follows the manifest's warm-up and
schedule counted in inner steps: an epoch is H of them, so the rate rises over
the first ``warmup_epochs`` x H inner steps and a cosine or linear schedule
reaches 0 after ``total_epochs`` x H (``p2ptrain.peers.optimizers``).

Progress is published with hivemind's ProgressTracker under
``{averaging_prefix(manifest)}_progress`` (like sync mode, so
``swarm.read_swarm`` reads both): ``epoch`` is the outer step, and
``samples_accumulated`` the samples trained in the current outer step. A peer
that has done its H inner steps waits until the swarm's samples reach
``target_batch_size`` (or a bounded wait passes), so peers meet at the same
outer step. A round that finds no group costs the peer its H local steps: it
resets to the global parameters and downloads the swarm's state (a lone outer
step would split it from the others). A peer whose epoch is behind the swarm
downloads the global parameters, the outer momentum and the epoch from a peer.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Sequence

import hivemind
import torch
from hivemind.compression import CompressionInfo, TensorRole
from hivemind.optim.progress_tracker import ProgressTracker

from p2ptrain.peers.compression_ladder import parse_rung, rung_for_peer
from p2ptrain.peers.compression_sparse import COUNTERS, allow_rungs, rung_compression
from p2ptrain.peers.error_feedback import ErrorFeedback
from p2ptrain.peers.optimizers import learning_rate_factor
from p2ptrain.peers.sync import CheckedStateMixin, StepOutcome, all_finite

logger = logging.getLogger(__name__)


def pseudo_gradients(global_parameters: Sequence[torch.Tensor], local_parameters: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``global - local`` for each parameter, in float32 on the global tensors' device."""
    return [
        global_parameter.float() - local_parameter.detach().to(global_parameter.device).float()
        for global_parameter, local_parameter in zip(global_parameters, local_parameters)
    ]


def make_outer_optimizer(global_parameters: Sequence[torch.Tensor], outer_lr: float, outer_momentum: float) -> torch.optim.SGD:
    """SGD with Nesterov momentum over the global parameters (plain SGD when ``outer_momentum`` is 0:
    torch's Nesterov needs a momentum), momentum buffers created up front (so their shapes are
    known before the first outer step, for state sharing)."""
    optimizer = torch.optim.SGD(list(global_parameters), lr=outer_lr, momentum=outer_momentum, nesterov=outer_momentum > 0)
    for parameter in optimizer.param_groups[0]["params"]:
        optimizer.state[parameter]["momentum_buffer"] = torch.zeros_like(parameter)
    return optimizer


def inner_lr_factor(local_steps: int, warmup_epochs: int = 0, lr_schedule: str = "constant",
                    total_epochs: int | None = None) -> Callable[[int], float]:
    """The inner learning rate's multiplier as a function of the run's inner step
    (``epoch * local_steps + inner steps done in this epoch``, 0-based): the
    manifest's warm-up and schedule with an epoch of ``local_steps`` inner steps.
    Raises ValueError for bad settings now, not mid-run."""
    warmup, total = warmup_epochs * local_steps, total_epochs * local_steps if total_epochs else None
    learning_rate_factor(0, warmup, lr_schedule, total)
    return lambda step: learning_rate_factor(step, warmup, lr_schedule, total)


def momentum_buffers(outer_optimizer: torch.optim.SGD) -> list[torch.Tensor]:
    """The outer optimizer's momentum buffers, in parameter order."""
    return [outer_optimizer.state[parameter]["momentum_buffer"] for parameter in outer_optimizer.param_groups[0]["params"]]


@torch.no_grad()
def apply_outer_step(
    global_parameters: Sequence[torch.Tensor],
    averaged_pseudo_gradients: Sequence[torch.Tensor],
    outer_optimizer: torch.optim.SGD,
    local_parameters: Sequence[torch.Tensor],
) -> None:
    """Take one outer step with the averaged pseudo-gradients, then reset the
    local parameters to the new global ones."""
    for global_parameter, pseudo_gradient in zip(global_parameters, averaged_pseudo_gradients):
        global_parameter.grad = pseudo_gradient.to(global_parameter.dtype).clone()
    outer_optimizer.step()
    outer_optimizer.zero_grad(set_to_none=True)
    for local_parameter, global_parameter in zip(local_parameters, global_parameters):
        local_parameter.copy_(global_parameter.to(local_parameter.device, local_parameter.dtype))


class PseudoGradientAverager(CheckedStateMixin):
    """Averages pseudo-gradients and shares the outer state (global parameters,
    momentum, epoch) with peers that download it."""

    def __init__(self, *, state_provider, **kwargs):
        self._state_provider = state_provider
        super().__init__(**kwargs)

    def get_current_state(self):
        metadata, tensors = self._state_provider()
        infos = [CompressionInfo.from_tensor(tensor, key=index, role=TensorRole.PARAMETER) for index, tensor in enumerate(tensors)]
        return metadata, tensors, infos


class DiLoCoTrainer:
    """Trains the trainable parameters with DiLoCo.

    Args:
        dht: the running hivemind DHT.
        prefix: ``averaging_prefix(manifest)``; peers average only within it.
        parameters: the trainable parameters (the local copy, inside the model).
        target_batch_size: samples the swarm trains per outer step; a peer that
            finished its H steps waits for the swarm to reach it.
        batch_size_per_step: samples per inner step on this peer.
        local_steps: H, inner steps per outer step.
        inner_lr: AdamW learning rate of the inner steps (its peak, under a schedule).
        warmup_epochs, lr_schedule, total_epochs: the inner learning rate's
            warm-up and schedule, in epochs of H inner steps (see the module doc).
        outer_lr, outer_momentum: the outer Nesterov SGD (0.7 and 0.9 in DiLoCo).
        compression: the rung this peer sends pseudo-gradients with (``compression_ladder``).
        allowed_compression: the rungs the run allows (None: only ``compression``); this
            peer's reducers refuse parts of any other rung.
        error_feedback_decay: on a sparse rung, the share of what was not sent that is
            carried into the next round (``error_feedback``).
        matchmaking_time: seconds peers spend forming an averaging group.
        averaging_timeout: seconds before a stuck averaging round is abandoned.
        client_mode: this peer cannot accept connections.
    """

    def __init__(
        self,
        *,
        dht: hivemind.DHT,
        prefix: str,
        parameters: Sequence[torch.nn.Parameter],
        target_batch_size: int,
        batch_size_per_step: int,
        local_steps: int,
        inner_lr: float,
        outer_lr: float,
        outer_momentum: float,
        compression: str,
        matchmaking_time: float,
        averaging_timeout: float,
        warmup_epochs: int = 0,
        lr_schedule: str = "constant",
        total_epochs: int | None = None,
        client_mode: bool = False,
        allowed_compression: Sequence[str] | None = None,
        error_feedback_decay: float = 1.0,
    ):
        self.parameters = list(parameters)
        self.local_steps = local_steps
        self.inner_lr = inner_lr
        self._lr_factor = inner_lr_factor(local_steps, warmup_epochs, lr_schedule, total_epochs)
        self.matchmaking_time, self.averaging_timeout = matchmaking_time, averaging_timeout
        self.local_epoch = 0
        self.inner_steps = 0
        self.samples_this_epoch = 0
        self.rejected_averages = 0  # averaging rounds whose result was not finite
        self._done_since: float | None = None
        self._lock = threading.Lock()

        self.global_parameters = [parameter.detach().to("cpu", torch.float32).clone() for parameter in self.parameters]
        self.inner_optimizer = torch.optim.AdamW(self.parameters, lr=inner_lr)
        self.outer_optimizer = make_outer_optimizer(self.global_parameters, outer_lr, outer_momentum)
        rung = rung_for_peer(compression, [parse_rung(name) for name in allowed_compression or [compression]])
        allow_rungs(allowed_compression or [compression])  # before the averager forks: its reducers check
        self.error_feedback = ErrorFeedback(rung, self.global_parameters, error_feedback_decay)
        self._payload_bytes_before = 0  # sparse payload sent before the last restore
        self.tracker = ProgressTracker(dht=dht, prefix=prefix, target_batch_size=target_batch_size, client_mode=client_mode, start=True)
        self.averager = PseudoGradientAverager(
            state_provider=self._shared_state,
            averaged_tensors=[torch.zeros_like(parameter) for parameter in self.global_parameters],
            dht=dht,
            prefix=f"{prefix}_diloco",
            min_matchmaking_time=matchmaking_time,
            request_timeout=min(3.0, matchmaking_time / 2),
            allreduce_timeout=averaging_timeout,
            compression=rung_compression(rung, self.global_parameters),
            client_mode=client_mode,
            start=True,
        )

    def _shared_state(self):
        with self._lock:
            tensors = [tensor.clone() for tensor in self.global_parameters + momentum_buffers(self.outer_optimizer)]
            return {"epoch": self.local_epoch}, tensors

    def wants_batch(self) -> bool:
        """False once this peer did its H inner steps and waits for the outer step."""
        return self.inner_steps < self.local_steps

    def is_behind(self) -> bool:
        """True when the swarm finished an outer step this peer did not take part in."""
        return self.local_epoch < self.tracker.global_epoch

    def step(self, samples: int) -> StepOutcome:
        """One inner AdamW step with the gradients in ``.grad``."""
        for group in self.inner_optimizer.param_groups:
            group["lr"] = self.current_lr()
        self.inner_optimizer.step()
        self.inner_optimizer.zero_grad(set_to_none=True)
        self.inner_steps += 1
        self.samples_this_epoch += samples
        self.tracker.report_local_progress(self.local_epoch, self.samples_this_epoch)
        return self.tick()

    def current_lr(self) -> float:
        """The inner learning rate of the next inner step."""
        return self.inner_lr * self._lr_factor(self.local_epoch * self.local_steps + self.inner_steps)

    def skip_batch(self) -> None:
        """Discard gradients of a batch that must not be contributed."""
        self.inner_optimizer.zero_grad(set_to_none=True)

    def tick(self) -> StepOutcome:
        """Take the outer step once this peer and the swarm are ready for it."""
        if self.inner_steps < self.local_steps:
            return StepOutcome()
        if self._done_since is None:
            self._done_since = time.monotonic()
        swarm_ready = self.tracker.ready_to_update_epoch or self.tracker.global_progress.num_peers <= 1
        waited_enough = time.monotonic() - self._done_since > 3 * self.matchmaking_time
        if not (swarm_ready or waited_enough):
            return StepOutcome()
        return self._outer_step()

    def _outer_step(self) -> StepOutcome:
        self._done_since = None
        if self.is_behind():
            return StepOutcome(loaded_state=self.load_state_from_peers())
        local_pseudo_gradients = pseudo_gradients(self.global_parameters, self.parameters)
        if not all_finite(local_pseudo_gradients):
            logger.warning("Non-finite pseudo-gradient: not contributed, local parameters reset to the global ones")
            self._reset_local()
            return StepOutcome()

        averaged_with, rejected_from = 1, None
        if self.tracker.global_progress.num_peers <= 1:
            averaged = self.error_feedback.everything(local_pseudo_gradients)
        else:
            outgoing = self.error_feedback.outgoing(local_pseudo_gradients)
            with self.averager.get_tensors() as buffers:
                for buffer, pseudo_gradient in zip(buffers, outgoing):
                    buffer.copy_(pseudo_gradient)
            try:
                group = self.averager.step(
                    weight=float(max(self.samples_this_epoch, 1)), gather=self.local_epoch, timeout=self.averaging_timeout
                )
            except Exception as error:
                logger.info("Outer averaging failed: %r", error)
                group = None
            if not group:
                self.error_feedback.not_sent()
                # others train in this run: a lone outer step would split this peer from them
                self._reset_local()
                return StepOutcome(loaded_state=self.load_state_from_peers(), failed_rounds=1)
            # what a peer gathers is whatever it sent (None, or anything from a broken peer): never sort it raw
            other_steps = {repr(epoch) for epoch in group.values() if epoch != self.local_epoch}
            if other_steps:
                logger.warning("Averaged with peers at other outer steps: %s", ", ".join(sorted(other_steps)))
            with self.averager.get_tensors() as buffers:
                averaged = [buffer.clone() for buffer in buffers]
            averaged_with = len(group)
            if not all_finite(averaged):
                # a peer sent NaN/inf (a broken GPU, fp16 overflow or malice): every
                # member of this round got it, so none has a good average to download;
                # step on our own pseudo-gradient, as a peer alone would
                logger.warning("Averaging with %d peers gave non-finite pseudo-gradients: not adopted, "
                               "outer step with this peer's own", len(group))
                self.rejected_averages += 1
                rejected_from = len(group)
                averaged, averaged_with = outgoing, None
            self.error_feedback.sent()

        with self._lock:
            apply_outer_step(self.global_parameters, averaged, self.outer_optimizer, self.parameters)
            self.local_epoch += 1
        self._start_epoch()
        return StepOutcome(epoch_advanced=True, averaged_with=averaged_with, non_finite_average=rejected_from)

    def _reset_local(self) -> None:
        with torch.no_grad():
            for parameter, global_parameter in zip(self.parameters, self.global_parameters):
                parameter.copy_(global_parameter.to(parameter.device, parameter.dtype))
        self.inner_steps = 0
        self.samples_this_epoch = 0

    def _start_epoch(self) -> None:
        self.inner_steps = 0
        self.samples_this_epoch = 0
        with self.tracker.pause_updates():
            self.tracker.update_epoch(new_epoch=self.local_epoch)
        if not self.averager.client_mode:
            self.averager.state_sharing_priority = self.local_epoch

    def load_state_from_peers(self) -> bool:
        """Download global parameters, outer momentum and epoch from a peer
        ahead of us (checked before adoption); True if adopted."""
        try:
            loaded = self.averager.load_state_from_peers(timeout=self.averaging_timeout)
        except Exception as error:
            logger.warning("Could not download state from peers: %r", error)
            loaded = None
        if loaded is None:
            return False
        metadata, tensors = loaded
        epoch = metadata.get("epoch") if isinstance(metadata, dict) else None
        if not isinstance(epoch, int) or epoch < self.local_epoch:
            logger.info("Not adopting downloaded state: its epoch %r is not ahead of ours (%d)", epoch, self.local_epoch)
            return False
        with self._lock, torch.no_grad():
            for target, source in zip(self.global_parameters + momentum_buffers(self.outer_optimizer), tensors):
                target.copy_(source)
            self.local_epoch = epoch
        self._reset_local()
        self._start_epoch()
        return True

    def state_dict(self) -> dict:
        with self._lock:
            return {
                "epoch": self.local_epoch,
                "global_parameters": [tensor.clone() for tensor in self.global_parameters],
                "outer_momentum": [tensor.clone() for tensor in momentum_buffers(self.outer_optimizer)],
                "inner_optimizer": self.inner_optimizer.state_dict(),
                "error_feedback": self.error_feedback.state_dict(),
                "sparse_payload_bytes": self.sparse_payload_bytes(),
            }

    def sparse_payload_bytes(self) -> int:
        """Bytes of sparse parts and answers this peer's averager sent in this run (``compression_sparse``)."""
        return self._payload_bytes_before + COUNTERS.parts_bytes + COUNTERS.answers_bytes

    def load_state_dict(self, state: dict) -> None:
        with self._lock, torch.no_grad():
            for target, source in zip(self.global_parameters, state["global_parameters"]):
                target.copy_(source)
            for target, source in zip(momentum_buffers(self.outer_optimizer), state["outer_momentum"]):
                target.copy_(source)
            self.inner_optimizer.load_state_dict(state["inner_optimizer"])
            self.local_epoch = int(state["epoch"])
        self.error_feedback.load_state_dict(state.get("error_feedback"))
        self._payload_bytes_before = int(state.get("sparse_payload_bytes", 0))
        self._reset_local()
        self._start_epoch()

    def shutdown(self) -> None:
        self.tracker.shutdown()
        self.averager.shutdown()
