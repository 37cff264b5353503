"""A group member that freezes mid-round is left out after a deadline set by the peers' recent rounds.

Eight real DiLoCo averagers on 127.0.0.1 (DHTs here, each averager its own
process, as a worker's), configured as a worker's on the internet but with a
60-s round timeout: no deadline per member (``sender_timeout``), so hivemind
waits for a member until the round's timeout. They average three rounds
together, each scheduled ahead and triggered once the group formed (as
``diloco_rounds`` does), which times them. In the fourth, once the group formed,
one member's averager process is stopped (a laptop whose lid closed, a line
that dropped), and the other seven are triggered. Before the deadline from
recent rounds (``RobustAverager._stall_deadlines``), their round waited 60 s
for it and failed for all seven; now they leave it out after
``MIN_STALL_S`` (its part of the reduction after twice that) and average
without it.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
from hivemind.averaging.control import AveragingStage

from p2ptrain.peers.robust.averager import MIN_STALL_S, ROUNDS_BEFORE_ADAPTING
from p2ptrain.peers.robust.reduce import RobustOptions
from p2ptrain.peers.training.diloco import PseudoGradientAverager

from test_state_download_check import start_dhts

pytestmark = [pytest.mark.swarm]

PEERS, SIZE, ROUND_TIMEOUT_S = 8, 64 * 1024, 60.0
PREFIX = "stall_diloco"


def averager(dht) -> PseudoGradientAverager:
    return PseudoGradientAverager(
        state_provider=lambda: ({"epoch": 0}, [torch.zeros(SIZE)]), averaged_tensors=[torch.zeros(SIZE)], dht=dht,
        prefix=PREFIX, min_matchmaking_time=3.0, request_timeout=1.5, allreduce_timeout=ROUND_TIMEOUT_S, start=True,
        robust=RobustOptions.for_pseudo_gradients(max_weight=1e6, inner_lr=1e-3, rounds_held=1.0, parameter_count=1))


def scheduled_round(averagers: list[PseudoGradientAverager], epoch: int) -> list:
    """Each averager's round of ``epoch``, scheduled ahead; returns their controls once every group formed."""
    for index, made in enumerate(averagers):
        with made.get_tensors() as tensors:
            tensors[0].fill_(1e-4 * (index + 1))
    controls = [made.schedule_round(epoch, ROUND_TIMEOUT_S) for made in averagers]
    deadline = time.monotonic() + 60
    while not all(control.stage == AveragingStage.AWAITING_TRIGGER for control in controls):
        assert time.monotonic() < deadline, [control.stage for control in controls]
        time.sleep(0.05)
    return controls


def trigger(controls: list) -> None:
    for control in controls:
        control.weight = 1.0
        control.allow_allreduce()


@pytest.mark.timeout(300)
def test_a_member_that_freezes_mid_round_is_left_out_and_the_others_average():
    dhts = start_dhts(PEERS)
    averagers = []
    stopped = None
    try:
        averagers += [averager(dht) for dht in dhts]
        for epoch in range(ROUNDS_BEFORE_ADAPTING):
            controls = scheduled_round(averagers, epoch)
            trigger(controls)
            for control in controls:
                assert len(control.result(timeout=ROUND_TIMEOUT_S + 30)) == PEERS
        controls = scheduled_round(averagers, ROUNDS_BEFORE_ADAPTING)
        stopped = averagers[-1].pid
        os.kill(stopped, signal.SIGSTOP)
        began = time.monotonic()
        trigger(controls[:-1])
        results = [control.result(timeout=ROUND_TIMEOUT_S + 30) for control in controls[:-1]]
        took = time.monotonic() - began
        print(f"\nthe seven averaged without the stopped member in {took:.1f} s (deadline: "
              f"{[made.stall_deadline for made in averagers[:-1]]})")
        assert all(result is not None for result in results)
        assert all(made.stall_deadline == MIN_STALL_S for made in averagers[:-1]), "rounds here take well under 3 s"
        # the stopped member's own part of the reduction is given up after twice the deadline
        assert took < 2 * MIN_STALL_S + 10 < ROUND_TIMEOUT_S, took
        with averagers[0].get_tensors() as tensors:
            # each averaged value is the mean of the seven (1..7 x 1e-4: 4e-4) where the stopped member reduced
            # nothing; its part keeps each peer's own value
            averaged = tensors[0]
        assert torch.isclose(averaged, torch.tensor(4e-4)).float().mean() > 0.5, averaged
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGCONT)
        for made in averagers:
            made.shutdown()
        for dht in dhts:
            dht.shutdown()
