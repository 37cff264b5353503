"""A pre-scheduled gradient round that found its group is used, though the progress records show no other peer yet.

Two real sync trainers (hivemind DHTs on 127.0.0.1, one process). Each
pre-schedules its gradient round and they form a group; then peer A's step
begins while its progress records still count only itself, as at a swarm's
start, right after others joined. hivemind would cancel A's round ("no other
peers"). The cancelled round still ran with the group at weight 0: B stepped on
an average without A's gradients, A stepped alone, and the two were a step
apart. In the scale lab (one public peer, three behind NAT) that split stalled
the swarm for minutes (``sync.py``'s module doc). Now A averages with the group
it found: both get the same weighted average.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch
from hivemind.averaging.control import AveragingStage

from p2ptrain.peers.training.sync import SyncTrainer
from sync_trainers import sync_pair

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(120)]


def accumulate(trainer: SyncTrainer, value: float, samples: int) -> None:
    trainer.parameters[0].grad = torch.full((8,), value)
    trainer.optimizer.grad_averager.accumulate_grads_(samples)


def test_a_round_that_found_its_group_averages_though_the_records_show_nobody_else():
    with sync_pair("found-group") as (a, b, _):
        peers = [a, b]
        accumulate(a, 1.0, 8)
        accumulate(b, 4.0, 24)
        for peer in peers:
            peer.optimizer.scheduled_grads = peer.optimizer.grad_averager.schedule_step(timeout=30.0)
        deadline = time.monotonic() + 30
        while not all(peer.optimizer.scheduled_grads.stage == AveragingStage.AWAITING_TRIGGER for peer in peers):
            assert time.monotonic() < deadline, "the two pre-scheduled rounds formed no group"
            time.sleep(0.1)
        b_round = b.optimizer.grad_averager.step(control=b.optimizer.scheduled_grads, reset_accumulators=True, wait=False)
        # A's records count only itself (what a peer sees before the others' first progress records reach it)
        a.tracker.global_progress = dataclasses.replace(a.tracker.global_progress, num_peers=1)
        assert a.optimizer._begin_averaging_gradients(None), "the round that found a group was skipped for want of peers"
        assert len(a.optimizer.scheduled_grads.result(30)) == 2 and len(b_round.result(30)) == 2
        expected = (1.0 * 8 + 4.0 * 24) / (8 + 24)
        for peer in peers:
            with peer.optimizer.grad_averager.get_tensors() as averaged:
                assert torch.allclose(averaged[0], torch.full((8,), expected)), averaged[0]
