"""A peer one epoch behind that averages in the swarm's round ends it at the swarm's epoch.

Two real sync trainers (hivemind DHTs on 127.0.0.1, one process, a thread each). A
stands on epoch 1, B on epoch 0, as after a round B missed (it had just joined, or
downloaded the state while the others averaged). B steps at once (the swarm is
ahead), and its round is A's. hivemind moved B to epoch 1 while A went to 2, and
B's exact check then downloaded the state and missed A's next round: in the
16-peer lab a returning peer averaged every other round and downloaded 11 times.
Now each round gathers its members' epochs, and B ends at A's epoch.
"""

from __future__ import annotations

import dataclasses
import threading

import pytest
import torch

from sync_trainers import sync_pair

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(120)]


def test_a_peer_one_epoch_behind_ends_the_round_at_its_groups_epoch():
    with sync_pair("straggler") as (ahead, behind, _):
        ahead.optimizer.state_averager.local_epoch = 1
        for trainer in (ahead, behind):
            optimizer = trainer.optimizer
            trainer.parameters[0].grad = torch.ones(8)
            optimizer.grad_averager.accumulate_grads_(8)
            # what each tracker reads once the other's record reaches it (set here: a read can be 30 s away)
            optimizer.tracker.global_progress = dataclasses.replace(optimizer.tracker.global_progress, epoch=1, num_peers=2)
        failures = []

        def update(trainer):
            try:
                trainer.optimizer._update_global_epoch(None)
            except BaseException as error:  # reported below, with the test's own assertion
                failures.append(error)

        threads = [threading.Thread(target=update, args=(trainer,)) for trainer in (ahead, behind)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(90)
        assert not failures and not any(thread.is_alive() for thread in threads)
        for trainer in (ahead, behind):
            groups, _, _ = trainer.optimizer.pop_finished_groups()
            assert groups == [2], "the two peers did not average together"
        assert ahead.local_epoch == 2
        assert behind.local_epoch == 2, "the peer behind ended the round one epoch short of its group"
        assert behind.tracker.local_progress.epoch == 2
