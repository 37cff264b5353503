"""A sync peer that leaves, pauses or restarts mid-epoch brings its accumulated gradients back.

A worker ends on ``leave`` and ``pause`` and starts again from its checkpoint on
``join`` and ``resume``. The checkpoint held the optimizer and the epoch but not
the gradients accumulated toward the epoch's round, so every absence dropped up
to an epoch of a peer's work: in the 16-peer scale lab with churn, a peer whose
two leaves each dropped an epoch's gradients had 72 % of its samples used. Now
the checkpoint keeps them, and the download at the return keeps them while the
swarm is at most ``MAX_ROUNDS_BEHIND`` epochs ahead (as for a slow peer).

Real sync trainers: hivemind DHTs on 127.0.0.1, one process.
"""

from __future__ import annotations

import contextlib

import hivemind
import pytest
import torch

from sync_trainers import sync_pair, sync_trainer
from p2ptrain.peers.training.sync import MAX_ROUNDS_BEHIND

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(120)]


def accumulated(trainer) -> torch.Tensor:
    return next(iter(trainer.optimizer.grad_averager._grad_accumulators())).clone()


@contextlib.contextmanager
def returning_peer(first_dht, prefix: str, saved_state: dict, saved_account: dict):
    """A new worker's trainer on its own DHT, restored as the worker restores it (account, then state)."""
    dht = hivemind.DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=first_dht.get_visible_maddrs())
    trainer = None
    try:
        trainer = sync_trainer(dht, prefix)
        trainer.account.load_dict(saved_account)
        trainer.load_state_dict(saved_state)
        yield trainer
    finally:
        if trainer is not None:
            trainer.shutdown()
        dht.shutdown()


def leave_mid_epoch(trainer) -> tuple[dict, dict, torch.Tensor]:
    """Two batches toward the epoch's round, then the checkpoint a ``leave`` writes."""
    for value in (1.0, 3.0):
        trainer.parameters[0].grad = torch.full((8,), value)
        trainer.step(8)
    return trainer.state_dict(), trainer.account.as_dict(), accumulated(trainer)


def move_swarm_to(trainer, epoch: int) -> None:
    """The swarm (this one peer) went on ``epoch`` epochs while the other was away."""
    trainer.optimizer.state_averager.local_epoch = epoch
    trainer.optimizer.state_averager.state_sharing_priority = epoch
    trainer.tracker.report_local_progress(epoch, 0)


@pytest.mark.parametrize("epochs_away", [MAX_ROUNDS_BEHIND])
def test_a_returning_peer_brings_its_epochs_gradients_to_the_next_round(epochs_away):
    with sync_pair("kept-over-restart") as (swarm, leaving, first_dht):
        state, account, gradients = leave_mid_epoch(leaving)
        leaving.shutdown()
        move_swarm_to(swarm, epochs_away)
        with returning_peer(first_dht, "kept-over-restart", state, account) as back:
            assert back.pending_samples == 16 and torch.equal(accumulated(back), gradients)
            back.load_state_from_peers()  # the worker's catch-up at the return
            assert back.local_epoch == epochs_away
            assert back.pending_samples == 16 and torch.equal(accumulated(back), gradients)
            assert back.account.pending == 16 and back.account.unused["late"] == 0
            assert_no_speed_from_restored_samples(back)


def assert_no_speed_from_restored_samples(trainer) -> None:
    """The samples put back were not trained just now: the peer has measured no speed yet, and its
    progress record says none (before, it said 16 samples in the milliseconds since the download,
    thousands a second, and every reader expected the epoch's end at once)."""
    assert trainer.tracker.performance_ema.num_updates == 0
    assert trainer.tracker.local_progress.samples_per_second < 1.0
    assert trainer.tracker.local_progress.samples_accumulated == 16


def test_gradients_from_further_behind_are_dropped_and_counted_late():
    with sync_pair("dropped-over-restart") as (swarm, leaving, first_dht):
        state, account, _ = leave_mid_epoch(leaving)
        leaving.shutdown()
        move_swarm_to(swarm, MAX_ROUNDS_BEHIND + 1)
        with returning_peer(first_dht, "dropped-over-restart", state, account) as back:
            back.load_state_from_peers()
            assert back.local_epoch == MAX_ROUNDS_BEHIND + 1 and back.pending_samples == 0
            assert back.account.unused["late"] == 16 and back.account.pending == 0


def test_a_restore_replaces_the_gradients_accumulated_since_the_checkpoint():
    """The divergence guard's rollback restores a checkpoint in a running worker: the batches
    accumulated after it (while training diverged) must not reach the next round."""
    with sync_pair("rollback-gradients") as (_, peer, __):
        state, _, gradients = leave_mid_epoch(peer)
        peer.parameters[0].grad = torch.full((8,), 1e6)
        peer.step(8)
        peer.load_state_dict(state)
        assert peer.pending_samples == 16 and torch.equal(accumulated(peer), gradients)
