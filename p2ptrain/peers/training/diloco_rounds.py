"""DiLoCo rounds that end on the swarm's work (``round_end: samples``, the default).

Volunteers' machines differ in speed by 10x or more. With DiLoCo's fixed H
(``p2ptrain.peers.training.diloco``, ``round_end: local_steps``) a fast peer that has
done its H inner steps waits for the slow ones, and a slow peer that finishes
its H steps after the others averaged finds the round gone. Here a round ends
when the samples the whole swarm trained in it reach ``target_batch_size`` (or
``round_time_limit_s`` passed); every peer trains until then, a fast one more
inner steps, a slow one fewer, and each peer's pseudo-gradient enters the
average weighted by the samples behind it. Nobody waits: a peer sends its
pseudo-gradient and trains on while the all-reduce runs, and when the average
arrives it re-bases what it trained since onto the new global parameters
(``diloco_math.rebase_local``); those samples count towards the next round.

What the literature did, and what we took:

- hivemind's Optimizer and DeDLOC ("Distributed Deep Learning in Open
  Collaborations", Diskin et al. 2021; before it Learning@home, "Towards
  Crowdsourced Training of Large Neural Networks using Decentralized
  Mixture-of-Experts", Ryabinin & Gusev 2020): a collaborative step ends when
  the peers *together* accumulated a target batch, whatever each one's share,
  and each peer's contribution is weighted by its samples. We end DiLoCo rounds
  the same way, with the same ProgressTracker, and weight pseudo-gradients the
  same way; matchmaking is pre-scheduled at the tracker's ETA as hivemind does
  for gradients, so a slow peer joins the group while it is still in a step.
- "Asynchronous Local-SGD Training for Language Modeling" (Liu et al. 2024):
  asynchronous updates through a parameter server let fast workers go on, but
  stale pseudo-gradients under outer Nesterov momentum slowed convergence; their
  Dynamic Local Updates give each worker a number of local steps proportional to
  its speed so that all finish together. Ending rounds on the swarm's samples
  gives that outcome without measuring anyone's speed, and keeps the rounds
  synchronous, so the outer momentum acts on fresh pseudo-gradients (no need for
  their Delayed Nesterov). Asynchrony needs a server holding the global model;
  a hivemind swarm has none (its all-reduce is symmetric), so we stay
  synchronous.
- HALoS (Kim et al. 2025) merges asynchronous updates in regional and global
  parameter servers with bounded staleness: again servers we do not have. What
  we keep is the bound: a peer that missed rounds re-bases its delta and joins
  the next one, up to ``MAX_ROUNDS_BEHIND`` rounds stale (``diloco.py``).
- Streaming DiLoCo (Douillard et al. 2025) and its "eager updates" (Kale et al.
  2025) overlap the outer all-reduce with the next inner steps. We overlap the
  whole round the same way (one round of delay for what was trained during it),
  without their fragments: our all-reduce is one hivemind round.
- DiPaCo (Douillard et al. 2024) trains paths of a modular model on separate
  workers: it shards the model rather than sharing one, so it does not apply.
- OpenDiLoCo (Jaghouar et al. 2024, also on hivemind) lets the fastest peer
  start the all-reduce after its H steps ("NO_WAIT"): what a slower peer trained
  by then is lost, the behaviour this module exists to avoid.

The default comes from ``benchmarks/heterogeneous.py`` (``benchmarks/RESULTS.md``):
with one peer at a quarter of the others' speed, at equal wall-clock time, these
rounds used 92 % of the swarm's samples (the slow peer's 89 %) and reached a
lower loss than fixed H (75 %, the slow peer's 0 %), and only they kept the fast
peers' idle time under 5 % (fixed H: a quarter of it).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

import torch
from hivemind.averaging.control import AveragingStage, StepControl
from hivemind.utils import get_dht_time

from p2ptrain.peers.training.diloco import DiLoCoTrainer
from p2ptrain.peers.training.diloco_math import pseudo_gradients
from p2ptrain.peers.training.round_loss import found_no_group
from p2ptrain.peers.training.sync import StepOutcome, all_finite
from p2ptrain.peers.training.settings import SwarmSettings

logger = logging.getLogger(__name__)

# how often the round watcher looks at the swarm's progress (seconds)
WATCH_INTERVAL_S = 0.2


@dataclasses.dataclass
class RoundInFlight:
    """This peer's pseudo-gradient is being averaged while it trains on.

    control: hivemind's handle of the averaging round.
    sent_from: the local parameters (CPU, float32) the pseudo-gradient was computed from.
    sent: on a sparse rung, the part of it that was sent (``error_feedback``); None: all of it.
    trained_since: samples trained since it was sent (they belong to the next round).
    """

    control: StepControl
    sent_from: list[torch.Tensor]
    sent: list[torch.Tensor] | None = None
    trained_since: int = 0


class SwarmRoundTrainer(DiLoCoTrainer):
    """DiLoCo whose rounds end on the swarm's samples; nobody waits (see the module doc).

    A *round watcher* thread joins the round's matchmaking and sends this peer's
    pseudo-gradient when the round ends, even in the middle of a long step (a slow
    peer's step can outlast a round): it reads the local parameters as the last
    finished inner step left them, which it may while the training thread runs a
    forward and backward pass; everything that changes them (inner steps, finishing
    a round, a download) holds ``_local_lock``. What changes the local parameters at
    a round's end (a lone outer step, dropping a non-finite delta) is left to the
    training thread, between steps.

    Args: those of ``DiLoCoTrainer``, where ``target_batch_size`` is the samples the
    swarm trains per round and ``local_steps`` (H) only sets the unit of the inner
    learning rate's warm-up and schedule (an epoch is H inner steps' worth of the
    round's progress), and:
        round_time_limit_s: a round also ends this many seconds after it began,
            however few samples the swarm trained (None: it ends on samples only).
    """

    def __init__(self, swarm: SwarmSettings, *, round_time_limit_s: float | None = None, **kwargs):
        super().__init__(swarm, **kwargs)
        self.round_time_limit_s = round_time_limit_s
        self._round: RoundInFlight | None = None
        self._scheduled: StepControl | None = None
        self._round_started = time.monotonic()
        self._retry_after = 0.0
        self._paused = False
        self._local_lock = threading.RLock()
        self._stopping = threading.Event()
        self._watcher = threading.Thread(target=self._watch_rounds, name="diloco-round-watcher", daemon=True)
        self._watcher.start()

    def wants_batch(self) -> bool:
        """Always: a peer trains until the swarm ends the round, and on while it is averaged."""
        return True

    def is_behind(self) -> bool:
        """True when the swarm finished a round this peer is not part of (then it downloads and re-bases)."""
        return self._round is None and not self._group_waits_for_us() and super().is_behind()

    def _count_fresh_samples(self, samples: int) -> None:
        if self._round is not None:
            self._round.trained_since += samples
        else:
            super()._count_fresh_samples(samples)

    def current_lr(self) -> float:
        """The inner learning rate: the schedule at this epoch plus the swarm's progress through the round."""
        progress = self.tracker.global_progress
        fraction = min(1.0, progress.samples_accumulated / self.target_batch_size) if progress.epoch == self.local_epoch else 1.0
        return self.lr_scale * self.inner_lr * self._lr_factor(self.local_epoch * self.local_steps + round(fraction * self.local_steps))

    def step(self, samples: int) -> StepOutcome:
        with self._local_lock:
            self._paused = False
            return super().step(samples)

    def tick(self) -> StepOutcome:
        """Between steps: collect a finished round, or end the current one when the swarm is there."""
        with self._local_lock:
            if self._round is not None:
                return self._finish_round() if self._round.control.done() else StepOutcome()
            return self._end_round_if_due(between_steps=True)

    def _watch_rounds(self) -> None:
        while not self._stopping.wait(WATCH_INTERVAL_S):
            try:
                with self._local_lock:
                    if self._round is None and not self._paused and not self._stopping.is_set():
                        self._end_round_if_due(between_steps=False)
            except Exception:
                logger.exception("The DiLoCo round watcher failed to end a round; the training thread will")

    def _end_round_if_due(self, between_steps: bool) -> StepOutcome:
        if self.pending_samples == 0 or self.is_behind():
            return StepOutcome()  # nothing to send yet, or the worker downloads the swarm's state first
        self._maybe_schedule_matchmaking()
        if self._round_ends():
            return self._send_round(between_steps)
        return StepOutcome()

    def _group_waits_for_us(self) -> bool:
        scheduled = self._scheduled
        return scheduled is not None and not scheduled.done() and scheduled.stage == AveragingStage.AWAITING_TRIGGER

    def _seconds_to_round_end(self) -> float:
        seconds = self.tracker.estimated_next_update_time - get_dht_time()
        if self.round_time_limit_s is not None:
            seconds = min(seconds, self._round_started + self.round_time_limit_s - time.monotonic())
        return seconds

    def _round_ends(self) -> bool:
        if self._group_waits_for_us():
            return True  # the swarm formed the round's group with us: it ends now for all its members
        if time.monotonic() < self._retry_after:
            return False
        if self.round_time_limit_s is not None and time.monotonic() - self._round_started >= self.round_time_limit_s:
            return True
        return self.tracker.ready_to_update_epoch

    def _maybe_schedule_matchmaking(self) -> None:
        """Look for the round's group from one matchmaking window before its expected end (as
        hivemind.Optimizer does for gradients): a peer in a long step still joins it."""
        if self._scheduled is not None and not self._scheduled.done():
            return
        if self.alone or time.monotonic() < self._retry_after:
            return
        if self._seconds_to_round_end() <= self.matchmaking_time:
            self._scheduled = self.averager.schedule_round(self.local_epoch, self.averaging_timeout)

    def _send_round(self, between_steps: bool) -> StepOutcome:
        """End this peer's round: send its pseudo-gradient (weighted by the samples behind it) and
        train on; ``between_steps``: called by the training thread, which may change the local parameters."""
        local_pseudo_gradients = pseudo_gradients(self.global_parameters, self.parameters)
        finite, alone = all_finite(local_pseudo_gradients), self.alone and self._scheduled is None
        if not between_steps and (alone or not finite):
            return StepOutcome()
        if not finite:
            self._drop_local_progress("rejected", "Non-finite pseudo-gradient: not contributed, local parameters reset to the global ones")
            self._tag_along()
            return StepOutcome()
        if alone:
            return self._adopt(self.error_feedback.everything(local_pseudo_gradients), averaged_with=1)
        scheduled, self._scheduled = self._scheduled, None
        outgoing = self.error_feedback.outgoing(local_pseudo_gradients)
        with self.averager.get_tensors() as buffers:
            for buffer, pseudo_gradient in zip(buffers, outgoing):
                buffer.copy_(pseudo_gradient)
        if scheduled is None or scheduled.done():
            scheduled = self.averager.schedule_round(self.local_epoch, self.averaging_timeout)
        scheduled.weight = float(self.pending_samples)
        scheduled.allow_allreduce()
        sent_from = [parameter.detach().to("cpu", torch.float32).clone() for parameter in self.parameters]
        self._round = RoundInFlight(scheduled, sent_from, outgoing if self.error_feedback.rung.sparse else None)
        return StepOutcome()

    def _finish_round(self) -> StepOutcome:
        finished, self._round = self._round, None
        exchange_failed = False
        try:
            group = finished.control.result(0)
        except BaseException as error:  # hivemind ends a round that found no group with an exception
            logger.info("Outer averaging failed: %r", error)
            group, exchange_failed = None, not found_no_group(error)
        if not group:
            self._count_round_without_group(found_group=exchange_failed)
            self.error_feedback.not_sent()
            # keep the local progress: the samples of this round and those trained since go into the next
            # attempt (re-based by the worker's download if the others averaged without us)
            self._retry_after = time.monotonic() + self.matchmaking_time
            self._count_fresh_samples(finished.trained_since)
            return StepOutcome(failed_rounds=int(not exchange_failed), failed_exchanges=int(exchange_failed))
        sent = finished.sent or pseudo_gradients(self.global_parameters, finished.sent_from)
        outcome = self._adopt_group_average(group, sent, finished.sent_from)
        self._round_started = time.monotonic()
        self._count_fresh_samples(finished.trained_since)
        return outcome

    def _tag_along(self) -> None:
        """Let a group that formed with this peer average without it (weight 0), as hivemind does."""
        scheduled, self._scheduled = self._scheduled, None
        if scheduled is None or scheduled.done() or scheduled.triggered:
            return
        if scheduled.stage == AveragingStage.AWAITING_TRIGGER:
            scheduled.weight = 0.0
            scheduled.allow_allreduce()
        else:
            scheduled.cancel()

    def pause(self) -> None:
        """Stop taking part in rounds until training resumes: a paused peer must not hold up a group."""
        with self._local_lock:
            self._paused = True
            self._tag_along()

    def load_state_from_peers(self) -> bool:
        with self._local_lock:
            if self._round is not None:
                return False  # the round in flight decides this peer's epoch
            self._tag_along()
            loaded = super().load_state_from_peers()
            if loaded:
                self._round_started = time.monotonic()
            return loaded

    def load_state_dict(self, state: dict) -> None:
        """``DiLoCoTrainer``'s, after letting go of the round in flight and the one scheduled: a
        restore mid-run (a rollback of the divergence guard) replaces the local parameters that
        round's pseudo-gradient was sent from, so its average could not be re-based on them."""
        with self._local_lock:
            if self._round is not None:
                if not self._round.control.done():
                    self._round.control.cancel()
                self._round = None
                self.error_feedback.not_sent()
            self._tag_along()
            super().load_state_dict(state)

    def state_dict(self) -> dict:
        with self._local_lock:
            state = super().state_dict()
            if self._round is not None:
                # what became of the round is unknown to a restarted peer: see DiLoCoTrainer.load_state_dict
                state["pending_samples"] += self._round.trained_since
                state["round_in_flight"] = True
            return state

    def shutdown(self) -> None:
        self._stopping.set()
        with self._local_lock:
            self._tag_along()
        self._watcher.join(timeout=5)
        super().shutdown()
