"""A peer one epoch behind that averages in the swarm's round ends it at the swarm's epoch.

Two real sync trainers (hivemind DHTs on 127.0.0.1, one process, a thread each). A
stands on epoch 1, B on epoch 0, as after a round B missed (it had just joined, or
downloaded the state while the others averaged). B steps at once (the swarm is
ahead), and its round is A's. hivemind moved B to epoch 1 while A went to 2, and
B's exact check then downloaded the state and missed A's next round: in the
16-peer lab a returning peer averaged every other round and downloaded 11 times.
Now each round gathers its members' epochs, and B ends at A's epoch; two peers
behind, alone in a round, end at the swarm's epoch and not past it.
"""

from __future__ import annotations

import dataclasses
import threading

import pytest
import torch

from sync_trainers import sync_pair

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(120)]


def update_together(trainers) -> None:
    """Both trainers' epoch updates at once (a thread each), as the end of an epoch starts them; they average together."""
    failures = []

    def update(trainer):
        try:
            trainer.optimizer._update_global_epoch(None)
        except BaseException as error:  # reported below, with the test's own assertion
            failures.append(error)

    threads = [threading.Thread(target=update, args=(trainer,)) for trainer in trainers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    assert not failures and not any(thread.is_alive() for thread in threads)
    for trainer in trainers:
        groups, _, _ = trainer.optimizer.pop_finished_groups()
        assert groups == [2], "the two peers did not average together"


def at_the_epochs_end(trainers, swarm_epoch: int) -> None:
    """Gradients in hand, and the progress records (as each tracker reads them) on ``swarm_epoch`` with two peers."""
    for trainer in trainers:
        optimizer = trainer.optimizer
        trainer.parameters[0].grad = torch.ones(8)
        optimizer.grad_averager.accumulate_grads_(8)
        # set here: a tracker's next read of the swarm can be 30 s away
        optimizer.tracker.global_progress = dataclasses.replace(optimizer.tracker.global_progress, epoch=swarm_epoch, num_peers=2)


def test_a_peer_one_epoch_behind_ends_the_round_at_its_groups_epoch():
    with sync_pair("straggler") as (ahead, behind, _):
        ahead.optimizer.state_averager.local_epoch = 1
        at_the_epochs_end((ahead, behind), swarm_epoch=1)
        update_together((ahead, behind))
        assert ahead.local_epoch == 2
        assert behind.local_epoch == 2, "the peer behind ended the round one epoch short of its group"
        assert behind.tracker.local_progress.epoch == 2


def test_two_peers_behind_alone_in_a_round_end_at_the_swarms_epoch():
    with sync_pair("stragglers") as (first, second, _):
        at_the_epochs_end((first, second), swarm_epoch=1)
        update_together((first, second))
        assert (first.local_epoch, second.local_epoch) == (1, 1), "stragglers moved past the swarm's epoch"


def test_a_peer_whose_round_was_the_swarms_next_one_ends_at_its_groups_epoch():
    """The peer stepped on its epoch (its records showed the swarm there too), but its matchmaking found
    the group only in the swarm's next round: just back, it had downloaded the state and began looking
    when the others' group had formed. It ended one epoch behind its group, downloaded again, and missed
    the next round the same way (16-peer lab: a returning peer took every other round)."""
    with sync_pair("late-group") as (ahead, behind, _):
        ahead.optimizer.state_averager.local_epoch = 1
        at_the_epochs_end((ahead,), swarm_epoch=1)
        at_the_epochs_end((behind,), swarm_epoch=0)  # its tracker had not read the swarm's new epoch yet
        update_together((ahead, behind))
        assert ahead.local_epoch == 2
        assert behind.local_epoch == 2, "the peer ended its late round one epoch short of its group"
