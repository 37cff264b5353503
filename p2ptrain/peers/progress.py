"""hivemind's ProgressTracker with a traffic budget: fewer progress records written and read.

Measured in the network lab (4 peers, ``benchmarks/RESULTS.md``), hivemind's
defaults make progress records the largest part of a peer's background
traffic:

- every local step stores a signed progress record in the DHT (several nodes
  each, ~1 store a second per peer while training), although readers do not
  need it: they extrapolate each peer's samples from its reported speed and
  the record's time;
- every peer reads the whole swarm's records as often as every 0.5 s when it
  expects the epoch to end soon, and a paused swarm keeps expecting that (its
  records still carry the speeds from before the pause), so paused peers read
  twice a second forever.

``QuietProgressTracker`` stores every ``report_period`` seconds, at once when
the local epoch changes or an epoch's first samples arrive, and on every step
only near the swarm's expected epoch end (``near_end_s`` before it). Readers
extrapolate each record by its speed, which is exact while a peer's pace is
steady; near the end the swarm decides who is in the round, so records are
fresh there (DiLoCo rounds that end on the swarm's samples lose a slow peer's
work when they are not: ``tests/integration/test_slow_peer.py``). It reads at
most every ``min_refresh_period`` seconds, so an epoch's end is seen up to
``min_refresh_period`` seconds late. Its reads come from the peer's own copy
of the records where that copy is complete (``local_reads``: in runs of up to
five serving peers, after the first minute), so most of them send nothing.
(A paused peer reads nothing: its worker has left the swarm.)
"""

from __future__ import annotations

import time

from hivemind.optim.progress_tracker import ProgressTracker
from hivemind.utils import get_dht_time

from p2ptrain.peers.local_reads import LocalFirstDHT

REPORT_PERIOD_S = 10.0
MIN_REFRESH_PERIOD_S = 2.0
MAX_REFRESH_PERIOD_S = 30.0


class QuietProgressTracker(ProgressTracker):
    """A ProgressTracker that writes and reads progress records less often (see the module docstring).

    Args:
        dht: the peer's DHT; progress is read through ``local_reads.LocalFirstDHT``.
        near_end_s: within this many seconds of the swarm's estimated epoch end every step is
            stored (the trainers pass 1.5 times their matchmaking time: a peer
            decides to join a round one matchmaking time before the end).
        report_period: seconds between stores of this peer's progress otherwise.
        **kwargs: hivemind's ProgressTracker arguments; ``min_refresh_period`` and
            ``max_refresh_period`` default to 2 and 30 seconds (hivemind: 0.5 and 10).
    """

    def __init__(self, dht, *args, near_end_s: float, report_period: float = REPORT_PERIOD_S, **kwargs):
        kwargs.setdefault("min_refresh_period", MIN_REFRESH_PERIOD_S)
        kwargs.setdefault("max_refresh_period", MAX_REFRESH_PERIOD_S)
        self.near_end_s, self.report_period = near_end_s, report_period
        self._last_trigger = -float("inf")
        super().__init__(LocalFirstDHT(dht), *args, **kwargs)

    def report_local_progress(self, local_epoch: int, samples_accumulated: int, update_global_samples: bool = True):
        """hivemind 1.1.12's, but the reporter thread is woken to store the record only when
        :meth:`should_store` says so (hivemind wakes it on every call, and its thread stores before a
        caller could take that back); the next store carries the latest numbers."""
        new_epoch = local_epoch != self.local_progress.epoch
        first_samples = samples_accumulated > 0 and (new_epoch or self.local_progress.samples_accumulated == 0)
        extra_samples = samples_accumulated - self.local_progress.samples_accumulated
        if update_global_samples and local_epoch == self.local_progress.epoch == self.global_progress.epoch:
            self.global_progress.samples_accumulated += extra_samples
        if extra_samples > 0:
            self.performance_ema.update(task_size=extra_samples)
        else:
            self.performance_ema.reset_timer()
        self.local_progress = self._get_local_progress(local_epoch, samples_accumulated)
        if new_epoch or first_samples or self.should_store():
            self._last_trigger = time.monotonic()
            self.should_report_progress.set()

    def should_store(self) -> bool:
        """Whether a step's progress is stored: near the swarm's epoch end, or ``report_period`` after the last store.

        (hivemind's reporter stores only for a peer it saw with samples in the current or the
        previous epoch, so an epoch's first samples are stored at once too.)"""
        near_end = self.global_progress.eta_next_epoch - get_dht_time() <= self.near_end_s
        return near_end or time.monotonic() - self._last_trigger >= self.report_period
