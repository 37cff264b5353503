"""Synchronous data-parallel training: hivemind.Optimizer over the trainable parameters.

Every peer accumulates gradients toward a shared ``target_batch_size``; when the
swarm has gathered that many samples, the peers average their gradients in one
all-reduce and take one AdamW step together. That is one epoch.

The hivemind progress record is ``{averaging_prefix(manifest)}_progress`` (the
optimizer's ``run_id`` is the averaging prefix), which is what ``swarm.read_swarm``
reads. DiLoCo (``diloco.py``) publishes under the same key.

A slow peer's gradients are not thrown away when the swarm's epoch moves on
without it. hivemind.Optimizer lets a peer one epoch behind step on its own
gradients (its parameters are then averaged with the others' in the next state
round), but a peer further behind (or, once per epoch, behind at all) downloads
the swarm's state and resets its gradient accumulators, and the batch in hand
is dropped too. ``SyncOptimizer`` keeps both across the download, up to
``MAX_ROUNDS_BEHIND`` epochs stale: they join the next epoch's all-reduce,
weighted by their samples, one to two steps stale, as hivemind's own delayed
parameter updates are one step stale. What hivemind does not allow: averaging
them into the round that the swarm already finished (a finished all-reduce
cannot be joined). The same holds over an absence: the checkpoint that a
``leave``, ``pause`` or stop writes keeps the accumulated gradients
(``SyncTrainer.state_dict``), and the download at the return keeps them on the
same terms; before, each absence dropped up to an epoch of the peer's work.

A pre-scheduled gradient round that has found its group is used, even when the
progress records do not show another peer yet. hivemind skips (cancels) such a
round when its records count no other peer, as at a swarm's start, when the
peers that just joined have not published progress. But a cancelled round whose
group had formed still ran, at weight 0 here (``CountingGradientAverager``), and
the others stepped on its average while the peer that cancelled it did not: the
swarm split into two epochs. With one public peer and the rest behind NAT (who
average as clients and share no state), that split stalled a 4-peer swarm for
minutes in the scale lab. A group found is proof that others are there.

A round that has found no group a while after the step triggered it is
abandoned (``GROUP_WAIT_MATCHMAKINGS`` matchmaking windows and
``GROUP_WAIT_EXTRA_S``): the others have averaged without this peer, which
steps on its own gradients and catches up at the next epoch's check. hivemind
waits for a group until the averaging timeout, which is sized for streaming
tensors (120 s on the internet): in the 8-peer lab two peers that missed a
group stood still for 2 minutes, skipped 6 epochs, and one's ``pause`` waited
that long too.

A peer one epoch behind that takes part in the swarm's next round ends it at
the swarm's epoch. Such a peer (it missed a round: it had just joined, or
downloaded the state while the others averaged) steps as soon as it sees the
swarm ahead, and its round is the swarm's next one. hivemind then moves it one
epoch, to the one the swarm just left, and its once-an-epoch exact check
downloads the state: it missed the next round and was behind again, averaging
every other round for the rest of its session (a returning peer in the 16-peer
lab took 57 % of its rounds and downloaded 11 times). Every gradient round
gathers each member's epoch (``CountingGradientAverager``); a peer that stepped
one epoch behind the swarm's progress records, and whose group had a member on
the swarm's epoch, takes the epoch that member goes to. Its parameters, one
optimizer step stale, are averaged with theirs in the state round of the same
step. A group of stragglers alone moves to the swarm's epoch, never past it.
The same holds for a peer that stepped on its epoch, but whose matchmaking
found the group only in the swarm's next round (a peer that had just
downloaded the state began looking when the others' group had formed): when
most of the other members were on the epoch the step brought it to, it goes
where they go. Before, it ended the round one epoch behind, downloaded the
state, and missed the next round the same way: in the 16-peer lab a returning
peer took every other round for its whole session. A minority that lies
about its epoch moves nobody; a lying majority moves a peer one epoch ahead of
the progress records, and its next check downloads the state.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
from typing import Callable, Sequence

import hivemind
import torch
from hivemind.averaging.control import AveragingStage
from hivemind.optim.state_averager import TrainingStateAverager
from hivemind.utils import MPFuture

from p2ptrain.peers.compression.codecs import make_compression
from p2ptrain.peers.training.optimizers import make_optimizer, make_scheduler
from p2ptrain.peers.training.progress import QuietProgressTracker
from p2ptrain.peers.robust.averager import GradientAverager, RobustAverager
from p2ptrain.peers.robust.reduce import RobustOptions, plausible_weight
from p2ptrain.peers.training.round_cancel import CancellableRounds, before_group
from p2ptrain.peers.training.round_loss import CountsLostParts, found_no_group
from p2ptrain.peers.training.sample_account import SampleAccount
from p2ptrain.peers.robust.trust import Trust
from p2ptrain.peers.training.settings import LrSchedule, SwarmSettings, start_round_log

logger = logging.getLogger(__name__)

# Averaging timings. On 127.0.0.1 groups form in well under a second; over the
# internet peers need several seconds to find each other and to stream tensors.
LOCAL_AVERAGING = {"matchmaking_time": 3.0, "averaging_timeout": 30.0}
INTERNET_AVERAGING = {"matchmaking_time": 15.0, "averaging_timeout": 120.0}
# a late peer's local progress (DiLoCo's delta, sync's accumulated gradients) is kept up to this
# many epochs behind the swarm; further behind it is too stale to help and is dropped
MAX_ROUNDS_BEHIND = 2
# a triggered gradient round still without a group after this many matchmaking windows, plus this
# many seconds, is abandoned (the module doc): 11 s on 127.0.0.1, 35 s on the internet
GROUP_WAIT_MATCHMAKINGS = 2
GROUP_WAIT_EXTRA_S = 5.0


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
    waited_s: seconds the call spent on rounds rather than on training (averaging, waiting
        for the swarm, state downloads), for the worker's idle time.
    averaged_share: the share of the ``averaged_with`` round's values that were really averaged
        (below 1.0 when a peer dropped out mid-round or a part's result was refused: the rest
        kept this peer's own values;
        ``peers.training.round_loss``).
    failed_exchanges: rounds since the last outcome whose group formed but whose data exchange failed.
    """

    epoch_advanced: bool = False
    averaged_with: int | None = None
    loaded_state: bool = False
    non_finite_average: int | None = None
    failed_rounds: int = 0
    waited_s: float = 0.0
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


class CheckedStateMixin(RobustAverager):
    """An averager whose shared state others download: robust rounds, and a downloaded
    state refused unless it passes ``state_check`` (finite, our shapes, near ours),
    then the next peer tried (``robust_averager``)."""


class CheckedTrainingStateAverager(TrainingStateAverager, CancellableRounds, CheckedStateMixin):
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
    """The robust GradientAverager (``robust_averager``) that knows how much of its last round
    was averaged, whose pre-scheduled rounds count nothing until triggered (``schedule_step``),
    that tells its group the optimizer's epoch, and that downloads nothing when the optimizer
    catches up (see ``load_state_from_peers``).

    Args:
        epoch: the optimizer's local epoch, gathered by every round (the module doc); None: none is told.
        args, kwargs: as ``GradientAverager``.
    """

    def __init__(self, *args, epoch: Callable[[], int] | None = None, **kwargs):
        self._epoch = epoch
        super().__init__(*args, **kwargs)

    def schedule_step(self, scheduled_time: float | None = None, **kwargs):
        """hivemind's pre-scheduled round, with weight 0 until the step that triggers it sets the
        samples it holds (``GradientAverager.step``).

        hivemind's optimizer cancels a pre-scheduled round when it counts no other peer yet, but
        the round can still run: cancelling first cancels the trigger, which the averager's process
        reads as "triggered", and a group found in that moment averages. It then ran with the
        default weight 1 and whatever the gradient buffers held (the gradients loaded for the next
        round, or the last round's average), the host ignored its result, and the other peer named
        an honest one (``far-from-own``, ``bad-result``, ``replayed``: seen under load at a swarm's
        start). At weight 0 such a round only tags along: nobody counts or judges its piece.

        Args:
            scheduled_time, kwargs: as hivemind's ``GradientAverager.schedule_step``.
        """
        if self._epoch is not None:
            kwargs.setdefault("gather", self._epoch())
        control = super().schedule_step(scheduled_time, **kwargs)
        control.weight = 0.0
        return control

    def load_state_from_peers(self, wait: bool = True, timeout: float | None = None):
        """Download nothing. hivemind's optimizer asks its gradient averager for the swarm's state
        after the state averager, but a ``GradientAverager`` throws the download away (another
        peer's gradient buffers, as large as the trained parameters): only the transfer was left."""
        if wait:
            return None
        skipped = MPFuture()
        skipped.set_result(None)
        return skipped


class SyncOptimizer(hivemind.Optimizer):
    """hivemind.Optimizer whose averagers are robust (``robust_averager``), that checks
    downloaded state, remembers the size of each finished gradient-averaging round,
    counts what became of this peer's samples (``account``) and keeps a late peer's
    gradients (see the module doc).

    ``trust``: this peer's ``Trust`` (bans, suspects); ``account``: its ``SampleAccount``;
    the rest as hivemind.Optimizer."""

    def __init__(self, *, trust: Trust, account: SampleAccount, client_mode: bool = False, **kwargs):
        self._trust = trust
        self._parameter_count = len(list(kwargs["params"]))
        kwargs["grad_averager_factory"] = functools.partial(
            CountingGradientAverager, trust=trust, robust=RobustOptions.for_gradients(plausible_weight(kwargs["target_batch_size"])),
            epoch=lambda: self.local_epoch)
        self.account = account
        self._batch_in_hand = 0
        self._averaging_client = client_mode
        self._finished_groups: list[int] = []
        self._rejected_groups: list[int] = []
        self._failed_rounds = self._failed_exchanges = 0
        self._last_share = 1.0
        self._round_epochs: dict = {}  # what the other members of this step's gradient round told (their epochs)
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
                                    banned=self._trust.banned, **kwargs)

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
            trust=self._trust,
            robust=RobustOptions.for_parameters(self._parameter_count),
            **kwargs,
        )

    def step(self, closure=None, batch_size: int | None = None, grad_scaler=None):
        self._batch_in_hand = batch_size if batch_size is not None else self.batch_size_per_step
        try:
            return super().step(closure=closure, batch_size=batch_size, grad_scaler=grad_scaler)
        finally:
            self._batch_in_hand = 0

    def _should_load_state_from_peers(self) -> bool:
        out_of_sync = super()._should_load_state_from_peers()
        if out_of_sync and self._batch_in_hand:
            # hivemind returns from step() without accumulating the batch in hand ("computed with
            # out-of-sync parameters"): accumulate it, load_state_from_peers keeps it with the rest
            self.grad_averager.accumulate_grads_(self._batch_in_hand)
        return out_of_sync

    def load_state_from_peers(self, **kwargs):
        self._cancel_rounds_without_group()
        # hivemind resets the accumulators after a download: save them, and put them back unless the
        # downloaded epoch is more than MAX_ROUNDS_BEHIND ahead of the one they were accumulated in
        kept, epoch_before = self.accumulated_gradients(), self.local_epoch
        super().load_state_from_peers(**kwargs)
        if kept is None:
            return
        if self.local_epoch - epoch_before > MAX_ROUNDS_BEHIND:
            self.account.add_unused("late", kept["samples"])
            return
        self.restore_accumulated_gradients(kept)

    def _cancel_rounds_without_group(self, state_too: bool = False) -> None:
        """Cancel the pre-scheduled gradient round (and, with ``state_too``, the state rounds) if it has found
        no group yet. Before a download hivemind tags along in it (weight 0) and waits for its end, up to
        the averaging timeout: a round still looking for its group (scheduled for the round the swarm just
        finished without this peer) held the download until the swarm's next group formed, 66 s of a first
        join in the 16-peer lab. A round whose group formed is left to hivemind: its members wait for this
        peer's part."""
        for name in ("scheduled_grads", "scheduled_state") if state_too else ("scheduled_grads",):
            scheduled = getattr(self, name)
            if scheduled is not None and not scheduled.done() and before_group(scheduled):
                scheduled.cancel()
                setattr(self, name, None)
        if state_too:
            self.state_averager.cancel_rounds(without_group=True)

    def shutdown(self) -> None:
        """hivemind's shutdown, without waiting for a round that found no group: it waits for the state round
        in flight and tags along in those scheduled ahead, and when nobody is left to join them that is the
        whole averaging timeout (a leave of the NAT lab's public peer, last, took 120-142 s in 2 of 3 runs)."""
        self._cancel_rounds_without_group(state_too=True)
        super().shutdown()

    def accumulated_gradients(self) -> dict | None:
        """A copy of the gradients accumulated toward this epoch's round, with the samples and
        batches behind them (GradientAverager's private fields, ``reuse_grad_buffers=False``);
        None when there are none. ``restore_accumulated_gradients`` puts them back."""
        averager = self.grad_averager
        if averager.local_samples_accumulated <= 0:
            return None
        return {"samples": averager.local_samples_accumulated, "times": averager.local_times_accumulated,
                "anchor": averager._anchor_batch_size,
                "gradients": [accumulator.detach().clone() for accumulator in averager._grad_accumulators()]}

    def restore_accumulated_gradients(self, saved: dict) -> None:
        """Put back what ``accumulated_gradients`` returned, and tell the swarm's progress records the
        samples; raises ValueError when the gradients do not match this model's parameters."""
        averager = self.grad_averager
        accumulators = list(averager._grad_accumulators())
        gradients = saved["gradients"]
        if len(gradients) != len(accumulators) or any(g.shape != a.shape for g, a in zip(gradients, accumulators)):
            raise ValueError("the saved gradients do not match this model's trainable parameters")
        with torch.no_grad():
            for accumulator, gradient in zip(accumulators, gradients):
                accumulator.copy_(gradient)
        averager.local_samples_accumulated, averager.local_times_accumulated = int(saved["samples"]), int(saved["times"])
        averager._anchor_batch_size = saved["anchor"]
        self.tracker.report_restored_samples(self.local_epoch, averager.local_samples_accumulated)

    def _update_global_epoch(self, grad_scaler) -> None:
        # the accumulated samples go into this epoch's averaged or local optimizer step
        samples = self.grad_averager.local_samples_accumulated
        self._round_epochs = {}
        swarm_epoch = self.tracker.global_epoch
        one_behind = swarm_epoch == self.local_epoch + 1
        super()._update_global_epoch(grad_scaler)
        self.account.add_contributed(samples)
        self._end_at_the_swarms_epoch(records_ahead=one_behind and self.local_epoch == swarm_epoch)

    def _end_at_the_swarms_epoch(self, records_ahead: bool) -> None:
        """After a step, when the other members of its gradient round were on the epoch it brought this
        peer to (the module doc), move to the next one, where they went.

        Args:
            records_ahead: the progress records showed the swarm on that epoch when the step began (the
                peer stepped one behind): one member there suffices. Without them (the peer stepped on
                its epoch, but found its group late, in the swarm's next round) most of them must be.
        """
        # what a peer gathers is whatever it sent (None, or anything from a broken peer): only ints count
        ahead = sum(type(epoch) is int and epoch == self.local_epoch for epoch in self._round_epochs.values())
        if not ahead or (not records_ahead and 2 * ahead <= len(self._round_epochs)):
            return
        epoch = self.local_epoch + 1
        logger.info("Averaged with %d of %d other peers one epoch ahead: moving to their epoch %d", ahead, len(self._round_epochs), epoch)
        with self.tracker.pause_updates():
            self.state_averager.local_epoch = epoch
            self.tracker.update_epoch(new_epoch=epoch)
        if not self.client_mode:
            self.state_averager.state_sharing_priority = epoch
            self.grad_averager.state_sharing_priority = epoch

    def _begin_averaging_gradients(self, grad_scaler) -> bool:
        scheduled = self.scheduled_grads
        found_group = (scheduled is not None and not scheduled.triggered and not scheduled.done()
                       and scheduled.stage == AveragingStage.AWAITING_TRIGGER)
        if not found_group or self.tracker.global_progress.num_peers > 1:
            return super()._begin_averaging_gradients(grad_scaler)
        # hivemind would skip (cancel) this round for want of peers in the progress records: see the module doc
        if grad_scaler is not None:
            with grad_scaler.running_global_step():
                assert grad_scaler.unscale_(self)
        try:
            self.scheduled_grads = self.grad_averager.step(control=scheduled, reset_accumulators=True, wait=False)
            return True
        except BaseException as error:
            logger.exception(error)
            return super()._begin_averaging_gradients(None)

    def _average_gradients_and_load_into_optimizer(self, maybe_step_control):
        self._round_rejected = False
        if maybe_step_control is not None:
            self._abandon_unless_grouped(maybe_step_control)
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
        if group:
            own = self.dht.peer_id
            self._round_epochs = {peer: epoch for peer, epoch in group.items() if peer != own}
        with self._groups_lock:
            if group:
                (self._rejected_groups if self._round_rejected else self._finished_groups).append(len(group))
                self._last_share = self.grad_averager.received_share()
            elif error is not None and not found_no_group(error):
                self._failed_exchanges += 1
            else:
                self._failed_rounds += 1

    def _abandon_unless_grouped(self, control) -> None:
        """Cancel the triggered round ``control`` if it finds no group in time (the module doc); hivemind
        then steps on the local gradients and this round counts as failed for want of a group."""
        deadline = time.monotonic() + GROUP_WAIT_MATCHMAKINGS * self.matchmaking_time + GROUP_WAIT_EXTRA_S
        while not control.done() and before_group(control):
            if time.monotonic() > deadline:
                logger.info("The gradient round found no group %.0f s after its step: stepping on the local gradients",
                            GROUP_WAIT_MATCHMAKINGS * self.matchmaking_time + GROUP_WAIT_EXTRA_S)
                control.cancel()
                return
            time.sleep(0.1)

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
        swarm: the swarm and this peer's share in it (``settings.SwarmSettings``), where
            ``target_batch_size`` is the samples the whole swarm gathers per epoch and
            ``compression`` the manifest's, used for gradients and state.
        optimizer: "adamw" or "lamb" (see ``p2ptrain.peers.training.optimizers``).
        schedule: the learning rate per global epoch (``optimizers.learning_rate_factor``).
    """

    def __init__(self, swarm: SwarmSettings, *, optimizer: str = "adamw", schedule: LrSchedule = LrSchedule()):
        matchmaking_time, averaging_timeout, inner_lr = swarm.matchmaking_time, swarm.averaging_timeout, swarm.inner_lr
        self.parameters = list(swarm.parameters)
        compressor = make_compression(swarm.compression, self.parameters)
        optimizer_name = optimizer
        self.trust = swarm.trust if swarm.trust is not None else Trust()
        self.account = SampleAccount()
        self.optimizer = SyncOptimizer(
            trust=self.trust,
            account=self.account,
            dht=swarm.dht,
            run_id=swarm.prefix,
            target_batch_size=swarm.target_batch_size,
            batch_size_per_step=swarm.batch_size_per_step,
            params=self.parameters,
            optimizer=lambda params: make_optimizer(optimizer_name, params, lr=inner_lr),
            # stepped by hivemind once per global epoch, so all peers share one learning rate
            scheduler=make_scheduler(schedule.warmup_epochs, schedule.lr_schedule, schedule.total_epochs),
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
            client_mode=swarm.client_mode,
            # hivemind warns (and can deadlock) when a request may outlive matchmaking
            averager_opts={"request_timeout": min(3.0, matchmaking_time / 2)},
            verbose=logger.isEnabledFor(logging.DEBUG) or start_round_log(),
        )
        self.tracker = self.optimizer.tracker
        self._state_rejections_seen = 0
        self._downloads_seen = 0

    @property
    def local_epoch(self) -> int:
        return self.optimizer.local_epoch

    @property
    def state_source(self) -> str | None:
        return self.optimizer.state_averager.last_state_source

    def wants_batch(self) -> bool:
        """Sync mode always takes the next batch."""
        return True

    def is_behind(self) -> bool:
        """True when the swarm is more than one epoch ahead (state must be downloaded)."""
        return self.optimizer.local_epoch < self.optimizer.tracker.global_epoch - 1

    @property
    def waiting(self) -> None:
        """Sync mode's samples wait only for the current epoch: nothing to explain (``Trainer.waiting``)."""
        return None

    @property
    def pending_samples(self) -> int:
        """Samples whose gradients wait in the accumulators for the epoch's all-reduce (between
        steps no round holds any: a round runs inside a step)."""
        return self.optimizer.grad_averager.local_samples_accumulated

    def scale_lr(self, scale: float) -> bool:
        """Returns False: every peer steps with the swarm's learning rate (they apply the same
        averaged gradients, and their parameters must stay the same), so none may lower its own."""
        return False

    def step(self, samples: int) -> StepOutcome:
        """Account for one local batch of ``samples`` whose gradients are in ``.grad``."""
        epoch_before = self.local_epoch
        self.account.add_trained(samples)
        started = time.monotonic()
        # accumulating is a cheap add: the time in here is hivemind's rounds (and one optimizer step an epoch)
        self.optimizer.step(batch_size=samples)
        self.optimizer.zero_grad(set_to_none=True)
        return dataclasses.replace(self._outcome(epoch_before), waited_s=time.monotonic() - started)

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
        # a download inside hivemind's step: this peer was behind, and skipped the round(s) it missed
        # (counted, not read from the epoch: a peer one epoch behind moves by one, as a round would)
        downloads = self.optimizer.state_averager.state_downloads
        downloaded, self._downloads_seen = downloads > self._downloads_seen, downloads
        return StepOutcome(
            epoch_advanced=self.local_epoch > epoch_before,
            averaged_with=groups[-1] if groups else None,
            loaded_state=downloaded,
            non_finite_average=rejected[-1] if rejected else None,
            failed_rounds=failed,
            averaged_share=share if groups else 1.0,
            failed_exchanges=failed_exchanges,
        )

    def skip_batch(self) -> None:
        """Discard gradients of a batch that must not be contributed."""
        for parameter in self.parameters:
            parameter.grad = None

    def pause(self) -> None:
        """Let a pre-scheduled gradient round average without this peer (weight 0), as hivemind
        does before a download: a paused peer must not hold up a group."""
        scheduled, self.optimizer.scheduled_grads = self.optimizer.scheduled_grads, None
        if scheduled is not None and not scheduled.done() and not scheduled.triggered:
            scheduled.weight = 0.0
            scheduled.allow_allreduce()

    def abandon_rounds(self, without_group: bool) -> None:
        """Cancel the gradient and state rounds in flight (``without_group``: only those before their
        group formed): a step waiting for one goes on with local gradients (hivemind's own fallback)
        instead of the whole averaging timeout. When a swarm stops at once, or a peer is left alone,
        the others never come to that round. From another thread: hivemind's step holds its handles,
        so they are cancelled, never replaced (unlike ``SyncOptimizer._cancel_rounds_without_group``)."""
        scheduled_grads = self.optimizer.scheduled_grads
        if scheduled_grads is not None and not scheduled_grads.done() and (not without_group or before_group(scheduled_grads)):
            scheduled_grads.cancel()
        # every state round, scheduled ahead (schedule_step) or started inside the step, goes through CancellableRounds
        self.optimizer.state_averager.cancel_rounds(without_group=without_group)

    def load_state_from_peers(self) -> bool:
        """Download the newest state from the swarm; True if the epoch moved."""
        epoch_before = self.local_epoch
        self.optimizer.load_state_from_peers()
        self._downloads_seen = self.optimizer.state_averager.state_downloads  # the caller reports this one
        return self.local_epoch != epoch_before

    def state_dict(self) -> dict:
        """The optimizer, the epoch, and the gradients accumulated toward this epoch's round
        (``accumulated``: None when there are none): a peer that leaves, pauses or restarts
        mid-epoch brings them to its next round, if it returns within ``MAX_ROUNDS_BEHIND`` epochs."""
        return {"optimizer": self.optimizer.state_dict(), "epoch": self.local_epoch,
                "accumulated": self.optimizer.accumulated_gradients()}

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict``'s output; the trainable parameters, restored into the model before,
        become the optimizer's too (hivemind keeps its own copy of them, offloaded), and the saved
        accumulated gradients (kept by the next download while at most ``MAX_ROUNDS_BEHIND`` epochs
        behind; ``pending_samples`` counts them)."""
        self.optimizer.load_state_dict(state["optimizer"])
        offloaded = [parameter for group in self.optimizer.opt.param_groups for parameter in group["params"]]
        with torch.no_grad():
            for copy, parameter in zip(offloaded, self.parameters):
                copy.copy_(parameter.to(copy.device, copy.dtype))
        self.optimizer.state_averager.local_epoch = int(state["epoch"])
        # hivemind moves the schedule only when an epoch ends: bring it to the restored epoch now
        self.optimizer.state_averager._update_scheduler()
        self.optimizer.tracker.report_local_progress(self.local_epoch, 0)
        # what the accumulators hold now (a rollback's diverged batches) is replaced by what was saved
        self.optimizer.grad_averager.reset_accumulated_grads_()
        if state.get("accumulated"):
            try:
                self.optimizer.restore_accumulated_gradients(state["accumulated"])
            except (KeyError, TypeError, ValueError) as error:
                self.optimizer.grad_averager.reset_accumulated_grads_()
                logger.warning("The checkpoint's accumulated gradients are not used: %s", error)

    def shutdown(self) -> None:
        self.optimizer.shutdown()
