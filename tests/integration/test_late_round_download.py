"""A DiLoCo peer whose round turned out to be the swarm's next one downloads at once.

Two real DiLoCo trainers (rounds on samples, the default; hivemind DHTs on 127.0.0.1).
A stands on epoch 3, B on epoch 1: B ended its round as the swarm's next one formed
and averaged into it (``DiLoCoTrainer._joined_a_later_round``). Its own global
parameters are older than the group's, so it must download A's state; but B waited
for its progress records to show the swarm's epoch, and when they lagged (rounds of a
few seconds, records read every few) its round watcher scheduled the next round's
matchmaking first, and a peer whose group waits for it is not "behind". It joined
every next round late the same way and never downloaded: in the three-peer test of
the defaults a joiner reported no epoch in four rounds (1 run in 4 in the suite).
Now the round itself says the peer is behind, for one download.
"""

from __future__ import annotations

import dataclasses
import time

import hivemind
import pytest
import torch

from p2ptrain.peers.training.diloco_rounds import SwarmRoundTrainer
from p2ptrain.peers.training.settings import SwarmSettings

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(120)]


def diloco_trainer(dht, prefix: str) -> SwarmRoundTrainer:
    """DiLoCo over 8 parameters on ``dht`` in the run ``prefix``, with a target batch no test reaches."""
    parameters = [torch.nn.Parameter(torch.zeros(8))]
    swarm = SwarmSettings(dht=dht, prefix=prefix, parameters=parameters, target_batch_size=10_000, batch_size_per_step=8,
                          inner_lr=1e-3, compression="none", matchmaking_time=3.0, averaging_timeout=30.0)
    return SwarmRoundTrainer(swarm, local_steps=4, outer_lr=1.0, outer_momentum=0.0)


def test_a_peer_that_averaged_into_a_later_round_downloads_before_the_records_show_it():
    first = hivemind.DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    second = hivemind.DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=first.get_visible_maddrs())
    trainers = []
    try:
        ahead = diloco_trainer(first, "late-round")
        trainers.append(ahead)
        behind = diloco_trainer(second, "late-round")
        trainers.append(behind)
        with torch.no_grad():  # two epochs apart, as near as a swarm's are (the download's state check)
            ahead.global_parameters[0].fill_(1.1)
            behind.global_parameters[0].fill_(1.0)
        ahead.local_epoch = 3
        ahead._start_epoch()  # its state is served at epoch 3

        # B's round finished in a group that gathered A's epoch; B's records still show its own
        behind.local_epoch = 1
        behind._start_epoch()
        behind.parameters[0].data.fill_(0.9)
        behind.samples_this_epoch = 8
        sent_from = [parameter.detach().clone() for parameter in behind.parameters]
        outcome = behind._adopt_group_average({"A": 3, "B": 1}, [torch.zeros(8)], sent_from)
        behind.tracker.global_progress = dataclasses.replace(behind.tracker.global_progress, epoch=1, num_peers=2)
        assert outcome.averaged_with == 2 and not outcome.epoch_advanced and behind.local_epoch == 1

        assert behind.is_behind(), "a peer that averaged into the swarm's later round waits for its records to download"
        deadline = time.monotonic() + 30
        while not behind.load_state_from_peers():  # until A's declaration as a donor reached B
            assert time.monotonic() < deadline, "B found no state to download from A"
            time.sleep(1)
        assert behind.local_epoch == 3 and torch.equal(behind.global_parameters[0], torch.full((8,), 1.1))
        assert not behind.is_behind(), "one download per such round"
    finally:
        for trainer in trainers:
            trainer.shutdown()
        second.shutdown()
        first.shutdown()
