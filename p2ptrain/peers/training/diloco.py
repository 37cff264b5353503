"""DiLoCo: many local steps, then one averaged outer step.

Each peer keeps two copies of the trainable parameters: the *global* ones (on
CPU, identical across the swarm after each outer step) and the *local* ones in
the model. It runs inner AdamW steps on the local copy, then computes the
pseudo-gradient ``global - local``, averages it with the compatible peers (a
hivemind all-reduce, weighted by the samples behind each peer's
pseudo-gradient), and applies an outer SGD step with Nesterov momentum to the
global parameters. One outer step is one epoch (a *round*). The inner learning
rate follows the manifest's warm-up and schedule counted in inner steps: an
epoch is H = ``local_steps`` of them, so the rate rises over the first
``warmup_epochs`` x H inner steps and a cosine or linear schedule reaches 0
after ``total_epochs`` x H (``p2ptrain.peers.training.optimizers``).

When a round ends is the manifest's ``round_end``. ``local_steps`` (this
module's :class:`DiLoCoTrainer`, the paper's setting, for equal hardware): each
peer takes H inner steps, then waits until the swarm's samples reach
``target_batch_size`` (or a bounded wait passes), so peers meet at the same
outer step. ``samples`` (:class:`p2ptrain.peers.training.diloco_rounds.SwarmRoundTrainer`,
the default): the round ends on the swarm's samples, every peer trains until
then and nobody waits; that module says why.

Progress is published with hivemind's ProgressTracker under
``{averaging_prefix(manifest)}_progress`` (like sync mode, so
``swarm.read_swarm`` reads both): ``epoch`` is the outer step, and
``samples_accumulated`` the samples trained in the current outer step.

No trained sample is thrown away for being slow. A round that finds no group
keeps the peer's local progress for the next round. A peer whose epoch is
behind the swarm (it arrived late, or its round failed while others averaged)
downloads the global parameters, the outer momentum and the epoch from a peer
and *re-bases* its local progress on them: ``local - global_old`` is kept as
its delta on top of the new global parameters, so it enters the next round's
average, weighted by all the samples behind it (with fixed H, at once: its H
steps are done). Only local progress that started more than
``MAX_ROUNDS_BEHIND`` rounds before the swarm's epoch (however often it was
re-based) is dropped, the peer starting over from the downloaded state: such a
delta is too stale to help. ``account`` (``p2ptrain.peers.training.sample_account``)
says what became of every sample.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Sequence

import torch
from hivemind.averaging.control import StepControl
from hivemind.compression import CompressionInfo, TensorRole

from p2ptrain.peers.training.diloco_math import (
    apply_outer_step,
    inner_lr_factor,
    make_outer_optimizer,
    momentum_buffers,
    pseudo_gradients,
    rebase_local,
    take_outer_step,
)
from p2ptrain.peers.compression.codecs import COUNTERS, allow_rungs, make_compression
from p2ptrain.peers.compression.ladder import parse_rung, rung_for_peer
from p2ptrain.peers.compression.error_feedback import ErrorFeedback, rounds_held
from p2ptrain.peers.robust.reduce import RobustOptions, plausible_weight
from p2ptrain.peers.training.sample_account import SampleAccount
from p2ptrain.peers.training.progress import QuietProgressTracker
from p2ptrain.peers.training.round_cancel import CancellableRounds
from p2ptrain.peers.training.round_loss import CountsLostParts, found_no_group
from p2ptrain.peers.training.sync import MAX_ROUNDS_BEHIND, CheckedStateMixin, StepOutcome, all_finite
from p2ptrain.peers.robust.trust import Trust
from p2ptrain.peers.training.settings import LrSchedule, SwarmSettings

logger = logging.getLogger(__name__)

# A peer whose last rounds found no group steps alone: its partners paused or left, and one that
# left without a goodbye (killed, its network gone) keeps its progress record in the DHT until it
# expires (hivemind: a minute), so the records alone would keep the peer looking for it meanwhile
# (on a GPU, 1,616 samples trained in 50 s and none used). Two rounds: one miss is a busy network.
ALONE_AFTER_ROUNDS_WITHOUT_GROUP = 2


class PseudoGradientAverager(CountsLostParts, CancellableRounds, CheckedStateMixin):
    """Averages pseudo-gradients and shares the outer state (global parameters,
    momentum, epoch) with peers that download it."""

    def __init__(self, *, state_provider, **kwargs):
        self._state_provider = state_provider
        super().__init__(**kwargs)

    def schedule_round(self, gather, timeout: float | None) -> StepControl:
        """A round that looks for its group now and averages when triggered, with weight 0 until the
        trigger sets the samples behind this peer's pseudo-gradient: a round cancelled while its group
        forms can still run (see ``sync.CountingGradientAverager.schedule_step``), and then it only tags
        along instead of counting a stale buffer at hivemind's default weight 1.

        Args:
            gather: what this peer tells its group (its epoch).
            timeout: hivemind's averaging timeout.
        """
        return self.step(gather=gather, timeout=timeout, weight=0.0, wait=False, require_trigger=True)

    def get_current_state(self):
        metadata, tensors = self._state_provider()
        infos = [CompressionInfo.from_tensor(tensor, key=index, role=TensorRole.PARAMETER) for index, tensor in enumerate(tensors)]
        return metadata, tensors, infos


class DiLoCoTrainer:
    """Trains the trainable parameters with DiLoCo, a round every H inner steps (``round_end: local_steps``).

    Args:
        swarm: the swarm and this peer's share in it (``settings.SwarmSettings``), where
            ``target_batch_size`` is the samples the swarm trains per outer step (a peer that
            finished its H steps waits for the swarm to reach it), ``inner_lr`` the inner
            AdamW's and ``compression`` the rung this peer sends pseudo-gradients with
            (``compression_ladder``).
        local_steps: H, inner steps per outer step.
        outer_lr, outer_momentum: the outer Nesterov SGD (0.7 and 0.9 in DiLoCo).
        schedule: the inner learning rate's warm-up and schedule, in epochs of H inner steps
            (see the module doc).
        allowed_compression: the rungs the run allows (None: only ``compression``); this
            peer's reducers refuse parts of any other rung.
        error_feedback_decay: on a sparse rung, the share of what was not sent that is
            carried into the next round (``error_feedback``).
    """

    def __init__(
        self,
        swarm: SwarmSettings,
        *,
        local_steps: int,
        outer_lr: float,
        outer_momentum: float,
        schedule: LrSchedule = LrSchedule(),
        allowed_compression: Sequence[str] | None = None,
        error_feedback_decay: float = 1.0,
    ):
        dht, prefix, compression, client_mode = swarm.dht, swarm.prefix, swarm.compression, swarm.client_mode
        target_batch_size, inner_lr, matchmaking_time = swarm.target_batch_size, swarm.inner_lr, swarm.matchmaking_time
        self.parameters = list(swarm.parameters)
        self.trust = swarm.trust if swarm.trust is not None else Trust()
        self.local_steps = local_steps
        self.target_batch_size = target_batch_size
        self.inner_lr = inner_lr
        self._lr_factor = inner_lr_factor(local_steps, schedule.warmup_epochs, schedule.lr_schedule, schedule.total_epochs)
        self.matchmaking_time, self.averaging_timeout = matchmaking_time, swarm.averaging_timeout
        self.local_epoch = 0
        self.inner_steps = 0
        self.samples_this_epoch = 0  # trained in this round (what the progress tracker counts)
        self.carried_samples = 0  # trained in earlier rounds, behind the local progress kept for this one
        self.delta_epoch = 0  # the epoch whose global parameters the local progress started from
        self.account = SampleAccount()
        self.rejected_averages = 0  # averaging rounds whose result was not finite
        self.rounds_without_group = 0  # rounds in a row that found no group (see ``alone``)
        # a round just showed the swarm ahead of this peer (``_joined_a_later_round``): download before the
        # next round, whatever the progress records say yet; one download per such round, so a peer that
        # gathered a false epoch into a round costs one download, not one per step
        self.download_due = False
        self.lr_scale = 1.0  # this peer's own inner lr multiplier (``scale_lr``)
        self._done_since: float | None = None
        self._lock = threading.Lock()

        self.global_parameters = [parameter.detach().to("cpu", torch.float32).clone() for parameter in self.parameters]
        self.inner_optimizer = torch.optim.AdamW(self.parameters, lr=inner_lr)
        self.outer_optimizer = make_outer_optimizer(self.global_parameters, outer_lr, outer_momentum)
        rungs = [parse_rung(name) for name in allowed_compression or [compression]]
        rung = rung_for_peer(compression, rungs)
        allow_rungs(allowed_compression or [compression])  # before the averager forks: its reducers check
        self.error_feedback = ErrorFeedback(rung, self.global_parameters, error_feedback_decay)
        self._payload_bytes_before = 0  # sparse payload sent before the last restore
        self.tracker = QuietProgressTracker(dht=dht, prefix=prefix, target_batch_size=target_batch_size, client_mode=client_mode,
                                            start=True, banned=self.trust.banned)
        self.averager = PseudoGradientAverager(
            state_provider=self._shared_state,
            averaged_tensors=[torch.zeros_like(parameter) for parameter in self.global_parameters],
            dht=dht,
            prefix=f"{prefix}_diloco",
            min_matchmaking_time=matchmaking_time,
            request_timeout=min(3.0, matchmaking_time / 2),
            allreduce_timeout=swarm.averaging_timeout,
            compression=make_compression(rung.name, self.global_parameters),
            client_mode=client_mode,
            start=True,
            trust=self.trust,
            robust=RobustOptions.for_pseudo_gradients(
                plausible_weight(max(target_batch_size, local_steps * swarm.batch_size_per_step)), inner_lr,
                # bounds a pseudo-gradient by the samples behind it, which this peer sends as its weight
                rounds_held(rungs, error_feedback_decay), parameter_count=len(self.global_parameters)),
        )

    def _shared_state(self):
        with self._lock:
            tensors = [tensor.clone() for tensor in self.global_parameters + momentum_buffers(self.outer_optimizer)]
            return {"epoch": self.local_epoch}, tensors

    @property
    def state_source(self) -> str | None:
        return self.averager.last_state_source

    @property
    def pending_samples(self) -> int:
        """Samples behind this peer's local progress: its weight in the next average, which also
        bounds its pseudo-gradient's values in the others' reducers (``robust_reduce``)."""
        return self.samples_this_epoch + self.carried_samples

    def wants_batch(self) -> bool:
        """False once this peer did its H inner steps and waits for the outer step."""
        return self.inner_steps < self.local_steps

    def is_behind(self) -> bool:
        """True when the swarm finished an outer step this peer did not take part in (its progress
        records say so, or the last round did: ``download_due``)."""
        return self.download_due or self.local_epoch < self.tracker.global_epoch

    @property
    def alone(self) -> bool:
        """No other peer to average with: the swarm's progress records show none, or the last
        ``ALONE_AFTER_ROUNDS_WITHOUT_GROUP`` rounds found no group (then it takes its outer step alone)."""
        return self.tracker.alone or self.rounds_without_group >= ALONE_AFTER_ROUNDS_WITHOUT_GROUP

    @property
    def waiting(self) -> str | None:
        """Why this peer's pending samples wait, when rounds find nobody (``Step.waiting``), else None."""
        if not self.rounds_without_group or self.tracker.alone:
            return None
        rounds = f"{self.rounds_without_group} averaging round{'s' if self.rounds_without_group > 1 else ''}"
        return (f"the last {rounds} found no other peer (they paused or left): this peer takes its outer steps alone "
                f"after {ALONE_AFTER_ROUNDS_WITHOUT_GROUP} such rounds, and looks for the others again every other round")

    def _count_round_without_group(self, found_group: bool) -> None:
        self.rounds_without_group = 0 if found_group else self.rounds_without_group + 1

    def scale_lr(self, scale: float) -> bool:
        """Multiply this peer's inner learning rate by ``scale`` (of the manifest's schedule, not
        of the current rate): the divergence guard lowers it after a rollback. Returns True: inner
        steps are this peer's own, so it may take them at a lower rate than the others."""
        self.lr_scale = scale
        return True

    def step(self, samples: int) -> StepOutcome:
        """One inner AdamW step with the gradients in ``.grad``, on a batch of ``samples``."""
        for group in self.inner_optimizer.param_groups:
            group["lr"] = self.current_lr()
        self.inner_optimizer.step()
        self.inner_optimizer.zero_grad(set_to_none=True)
        self.inner_steps += 1
        self.account.add_trained(samples)
        self._count_fresh_samples(samples)
        started = time.monotonic()
        outcome = self.tick()
        outcome.waited_s = time.monotonic() - started
        return outcome

    def _count_fresh_samples(self, samples: int) -> None:
        self.samples_this_epoch += samples
        self.tracker.report_local_progress(self.local_epoch, self.samples_this_epoch)

    def current_lr(self) -> float:
        """The inner learning rate of the next inner step."""
        return self.lr_scale * self.inner_lr * self._lr_factor(self.local_epoch * self.local_steps + self.inner_steps)

    def skip_batch(self) -> None:
        """Discard gradients of a batch that must not be contributed."""
        self.inner_optimizer.zero_grad(set_to_none=True)

    def pause(self) -> None:
        """Nothing to let go of: a round of fixed H runs inside ``step``/``tick``, never while paused."""

    def abandon_rounds(self, without_group: bool) -> None:
        """Cancel the round an outer step waits for (or, in rounds on samples, the one in flight;
        ``without_group``: only before its group formed): it ends as a round without a group, and the
        local progress is kept."""
        self.averager.cancel_rounds(without_group=without_group)

    def tick(self) -> StepOutcome:
        """Take the outer step once this peer and the swarm are ready for it."""
        if self.inner_steps < self.local_steps:
            return StepOutcome()
        if self._done_since is None:
            self._done_since = time.monotonic()
        swarm_ready = self.tracker.ready_to_update_epoch or self.alone
        waited_enough = time.monotonic() - self._done_since > 3 * self.matchmaking_time
        if not (swarm_ready or waited_enough):
            return StepOutcome()
        return self._outer_step()

    def _outer_step(self) -> StepOutcome:
        self._done_since = None
        if self.is_behind():
            loaded = self.load_state_from_peers()
            if loaded and self.pending_samples:
                # its H steps are done and re-based: it joins the round in progress (waiting for the others)
                self.inner_steps = self.local_steps
            return StepOutcome(loaded_state=loaded)
        local_pseudo_gradients = pseudo_gradients(self.global_parameters, self.parameters)
        if not all_finite(local_pseudo_gradients):
            self._drop_local_progress("rejected", "Non-finite pseudo-gradient: not contributed, local parameters reset to the global ones")
            return StepOutcome()

        if self.alone:
            return self._adopt(self.error_feedback.everything(local_pseudo_gradients), averaged_with=1)
        outgoing = self.error_feedback.outgoing(local_pseudo_gradients)
        with self.averager.get_tensors() as buffers:
            for buffer, pseudo_gradient in zip(buffers, outgoing):
                buffer.copy_(pseudo_gradient)
        exchange_failed = False
        try:
            # started without waiting, so that abandon_rounds can cancel it
            group = self.averager.step(
                weight=float(max(self.pending_samples, 1)), gather=self.local_epoch, timeout=self.averaging_timeout, wait=False
            ).result()
        except Exception as error:  # hivemind ends a round without a group with an exception (a cancelled one too)
            logger.info("Outer averaging failed: %r", error)
            group, exchange_failed = None, not found_no_group(error)
        if not group:
            self._count_round_without_group(found_group=exchange_failed)
            self.error_feedback.not_sent()
            # a lone outer step would split this peer from the others: its local progress goes
            # into the next round instead, re-based if the others averaged without it
            loaded = self.load_state_from_peers()
            if not loaded:
                self._carry_into_next_round()
            return StepOutcome(loaded_state=loaded, failed_rounds=int(not exchange_failed), failed_exchanges=int(exchange_failed))
        return self._adopt_group_average(group, outgoing)

    def _adopt_group_average(self, group: dict, sent: list[torch.Tensor], sent_from=None) -> StepOutcome:
        """The outer step after a finished averaging round of ``group`` (hivemind's gathered
        epochs by peer); ``sent``: what this peer sent (its pseudo-gradient, or on a sparse rung
        the part ``error_feedback`` chose); ``sent_from``: the local parameters the pseudo-gradient
        was sent from, when this peer trained on during the round (None: the local parameters are reset)."""
        self.error_feedback.sent()  # the group's average holds what was sent: the rest is the residual
        self._count_round_without_group(found_group=True)
        # what a peer gathers is whatever it sent (None, or anything from a broken peer): never sort it raw
        other_steps = {repr(epoch) for epoch in group.values() if epoch != self.local_epoch}
        if other_steps:
            logger.info("Averaged with peers at other outer steps: %s", ", ".join(sorted(other_steps)))
        if any(isinstance(epoch, int) and epoch > self.local_epoch for epoch in group.values()):
            return self._joined_a_later_round(len(group), sent_from)
        with self.averager.get_tensors() as buffers:
            averaged = [buffer.clone() for buffer in buffers]
        if not all_finite(averaged):
            # a peer sent NaN/inf (a broken GPU, fp16 overflow or malice): every
            # member of this round got it, so none has a good average to download;
            # step on our own pseudo-gradient, as a peer alone would
            logger.warning("Averaging with %d peers gave non-finite pseudo-gradients: not adopted, "
                           "outer step with this peer's own", len(group))
            self.rejected_averages += 1
            return self._adopt(sent, averaged_with=None, rejected_from=len(group), sent_from=sent_from)
        return self._adopt(averaged, averaged_with=len(group), sent_from=sent_from)

    def _adopt(self, averaged: list[torch.Tensor], averaged_with: int | None, rejected_from: int | None = None,
               sent_from=None) -> StepOutcome:
        """Take the outer step with ``averaged`` and start the next epoch; the pending samples
        are contributed, or rejected when the swarm's average was not adopted."""
        weight = self.pending_samples
        if averaged_with == 1 and self.rounds_without_group:
            # stepped alone for want of a group: the next round looks for the others once more,
            # so a partner that comes back is found (two lone peers would drift apart)
            self.rounds_without_group = ALONE_AFTER_ROUNDS_WITHOUT_GROUP - 1
        with self._lock:
            if sent_from is None:
                apply_outer_step(self.global_parameters, averaged, self.outer_optimizer, self.parameters)
            else:
                take_outer_step(self.global_parameters, averaged, self.outer_optimizer)
                rebase_local(self.parameters, sent_from, self.global_parameters)
            self.local_epoch += 1
        if rejected_from is None:
            self.account.add_contributed(weight)
        else:
            self.account.add_unused("rejected", weight)
        self._start_epoch()
        share = self.averager.received_share() if averaged_with and averaged_with > 1 else 1.0
        return StepOutcome(epoch_advanced=True, averaged_with=averaged_with, non_finite_average=rejected_from,
                           averaged_share=share)

    def _joined_a_later_round(self, group_size: int, sent_from) -> StepOutcome:
        """This peer was behind the peers it averaged with (it ended its round as theirs formed):
        its pseudo-gradient went into their outer step, one round stale, but their global
        parameters are not ours, so their average is not ours to apply. Keep only what was
        trained since sending (over our global parameters); the worker then downloads their
        state, re-basing that progress on it (``download_due``: the progress records may not show
        their epoch yet, and a peer that waited for them joined the swarm's next round late again,
        every round, without ever downloading)."""
        self.download_due = True
        logger.info("Averaged with peers ahead of this one's outer step %d: downloading their state", self.local_epoch)
        self.account.add_contributed(self.pending_samples)
        if sent_from is None:
            self._reset_local()
        else:
            rebase_local(self.parameters, sent_from, self.global_parameters)
        self.samples_this_epoch = self.carried_samples = self.inner_steps = 0
        return StepOutcome(averaged_with=group_size)

    def _drop_local_progress(self, reason: str, message: str) -> None:
        """Reset the local parameters to the global ones; the samples behind them are unused for ``reason``."""
        logger.warning(message)
        self.account.add_unused(reason, self.pending_samples)
        self._reset_local()

    def _carry_into_next_round(self) -> None:
        """Keep the local progress and its samples for the next round (another H inner steps)."""
        self.carried_samples += self.samples_this_epoch
        self.samples_this_epoch = 0
        self.inner_steps = 0
        self.tracker.report_local_progress(self.local_epoch, 0)

    def _reset_local(self) -> None:
        with torch.no_grad():
            for parameter, global_parameter in zip(self.parameters, self.global_parameters):
                parameter.copy_(global_parameter.to(parameter.device, parameter.dtype))
        self.inner_steps = 0
        self.samples_this_epoch = 0
        self.carried_samples = 0
        self.delta_epoch = self.local_epoch

    def _start_epoch(self) -> None:
        self.inner_steps = 0
        self.samples_this_epoch = 0
        self.carried_samples = 0
        self.delta_epoch = self.local_epoch
        with self.tracker.pause_updates():
            self.tracker.update_epoch(new_epoch=self.local_epoch)
        if not self.averager.client_mode:
            self.averager.state_sharing_priority = self.local_epoch

    def load_state_from_peers(self) -> bool:
        """Download global parameters, outer momentum and epoch from a peer ahead of
        us (checked before adoption) and re-base the local progress on them (dropped
        when more than ``MAX_ROUNDS_BEHIND`` rounds behind); True if adopted."""
        self.download_due = False
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
        # the local progress is as old as the global parameters it started from, however often it was re-based
        pending, delta_epoch = self.pending_samples, self.delta_epoch
        keep = pending > 0 and epoch - delta_epoch <= MAX_ROUNDS_BEHIND
        with self._lock, torch.no_grad():
            old_global = [tensor.clone() for tensor in self.global_parameters]
            for target, source in zip(self.global_parameters + momentum_buffers(self.outer_optimizer), tensors):
                target.copy_(source)
            behind, self.local_epoch = epoch - self.local_epoch, epoch
        if keep:
            rebase_local(self.parameters, old_global, self.global_parameters)
            logger.info("Re-based %d samples of local progress on the swarm's epoch %d (%d behind)", pending, epoch, behind)
        elif pending:
            self._drop_local_progress("late", f"local progress from outer step {delta_epoch}, {epoch - delta_epoch} behind the "
                                              f"swarm (more than {MAX_ROUNDS_BEHIND}): its {pending} samples are dropped")
        else:
            self._reset_local()
        self._start_epoch()
        if keep:
            self.carried_samples, self.delta_epoch = pending, delta_epoch
        return True

    def state_dict(self) -> dict:
        with self._lock:
            return {
                "epoch": self.local_epoch,
                "global_parameters": [tensor.clone() for tensor in self.global_parameters],
                "outer_momentum": [tensor.clone() for tensor in momentum_buffers(self.outer_optimizer)],
                "inner_optimizer": self.inner_optimizer.state_dict(),
                "pending_samples": self.pending_samples,
                "delta_epoch": self.delta_epoch,
                "error_feedback": self.error_feedback.state_dict(),
                "sparse_payload_bytes": self.sparse_payload_bytes(),
            }

    def sparse_payload_bytes(self) -> int:
        """Bytes of sparse parts and answers this peer's averager sent in this run (``compression.COUNTERS``)."""
        return self._payload_bytes_before + COUNTERS.parts_bytes + COUNTERS.answers_bytes

    def load_state_dict(self, state: dict) -> None:
        """Restore a checkpoint (``account`` restored before); its local parameters (restored
        into the model before) keep their progress over its global ones, for the next round.

        Progress checkpointed while its round was being averaged is dropped (``failed_round``):
        whether the swarm adopted that round is unknown now, and re-sending it could count it twice."""
        with self._lock, torch.no_grad():
            for target, source in zip(self.global_parameters, state["global_parameters"]):
                target.copy_(source)
            for target, source in zip(momentum_buffers(self.outer_optimizer), state["outer_momentum"]):
                target.copy_(source)
            self.inner_optimizer.load_state_dict(state["inner_optimizer"])
            self.local_epoch = int(state["epoch"])
        self.error_feedback.load_state_dict(state.get("error_feedback"))
        self._payload_bytes_before = int(state.get("sparse_payload_bytes", 0))
        self._start_epoch()
        # a checkpoint of an older p2ptrain has no pending samples: its local progress was reset on restore
        self.carried_samples = int(state.get("pending_samples", 0))
        self.delta_epoch = int(state.get("delta_epoch", self.local_epoch))
        if state.get("round_in_flight"):
            self._drop_local_progress("failed_round", f"restarted during an averaging round: its {self.carried_samples} samples are not used")
        elif not self.carried_samples:
            self._reset_local()

    def shutdown(self) -> None:
        self.tracker.shutdown()
        self.averager.shutdown()
