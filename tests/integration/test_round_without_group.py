"""A step does not wait out the averaging timeout for a gradient round that finds no group.

A real sync trainer (a hivemind DHT on 127.0.0.1) whose records show another
peer begins its round at the epoch's end, and nobody comes. hivemind waits for
a group until the averaging timeout (120 s on the internet): in the 8-peer lab
two peers that missed their group stood still for 2 minutes and skipped 6
epochs, and a ``p2ptrain pause`` sent meanwhile waited as long. Now the round
is abandoned after two matchmaking windows and 5 s, the step goes on with the
local gradients, and the round counts as failed for want of a group.
"""

from __future__ import annotations

import dataclasses
import time

import hivemind
import pytest
import torch

from p2ptrain.peers.training.sync import GROUP_WAIT_EXTRA_S, GROUP_WAIT_MATCHMAKINGS
from sync_trainers import sync_trainer

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(180)]
MATCHMAKING_S = 3.0
AVERAGING_TIMEOUT_S = 90.0


def test_a_round_that_finds_no_group_is_abandoned_long_before_the_averaging_timeout():
    dht = hivemind.DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    trainer = None
    try:
        trainer = sync_trainer(dht, "no-group", matchmaking_time=MATCHMAKING_S, averaging_timeout=AVERAGING_TIMEOUT_S)
        optimizer = trainer.optimizer
        trainer.parameters[0].grad = torch.ones(8)
        optimizer.grad_averager.accumulate_grads_(8)
        # the records show a second peer, who never comes to the round
        optimizer.tracker.global_progress = dataclasses.replace(optimizer.tracker.global_progress, num_peers=2)
        started = time.monotonic()
        assert optimizer._begin_averaging_gradients(None)
        optimizer._average_gradients_and_load_into_optimizer(optimizer.scheduled_grads)
        took = time.monotonic() - started
        assert took < GROUP_WAIT_MATCHMAKINGS * MATCHMAKING_S + GROUP_WAIT_EXTRA_S + 15, \
            f"the step waited {took:.0f} s for a group (averaging timeout {AVERAGING_TIMEOUT_S:.0f} s)"
        groups, rejected, failed = optimizer.pop_finished_groups()
        assert (groups, rejected, failed) == ([], [], 1)
    finally:
        if trainer is not None:
            trainer.shutdown()
        dht.shutdown()
