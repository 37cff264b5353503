"""A DiLoCo round in which one group member freezes after its group formed: run and timed.

Real averagers on 127.0.0.1 (their DHTs in this process, each averager its own
process, as a worker's), configured as a worker's on the internet (no deadline
per member unless p2ptrain's averager sets one) with the round timeout given.
They average ``ROUNDS_BEFORE_ADAPTING`` rounds together, each scheduled ahead and
triggered once its group formed (as ``diloco_rounds`` does), which times them.
In the next, once the group formed, the last member's averager process is
stopped (a laptop whose lid closed, a line that dropped) and the others are
triggered. ``tests/integration/test_round_stall.py`` checks it;
``benchmarks/round_stall.py`` measures it with and without the deadlines from
recent rounds.
"""

from __future__ import annotations

import os
import signal
import time

import torch
from hivemind import DHT
from hivemind.averaging.control import AveragingStage

from p2ptrain.peers.robust import averager as averager_module
from p2ptrain.peers.robust.reduce import RobustOptions
from p2ptrain.peers.training.diloco import PseudoGradientAverager

PREFIX = "stall_diloco"
SIZE = 64 * 1024  # floats averaged: a round takes well under a second here


def stalled_round(peers: int, round_timeout_s: float, adapt: bool = True) -> dict:
    """Run the rounds; returns what the last one measured.

    Args:
        peers: averagers in the group (the last is stopped).
        round_timeout_s: the averagers' round timeout (``allreduce_timeout``; 120 s on the internet).
        adapt: whether the averagers set deadlines from their recent rounds (False: hivemind's fixed ones,
            by never counting enough rounds; set before the averagers' processes fork).

    Returns:
        ``seconds``: from the trigger until the others' round ended; ``averaged``: how many of the others' rounds
        succeeded; ``deadlines``: the others' ``stall_deadline``; ``mean``: the share of the first peer's values
        at the others' mean (the rest kept its own where the stopped member reduced); ``rounds_s``: the rounds
        before, as the first peer waited for them.
    """
    averager_module.ROUNDS_BEFORE_ADAPTING = 3 if adapt else 2**31
    dhts, averagers, stopped = [], [], None
    try:
        dhts.append(DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"]))
        bootstrap = [str(address) for address in dhts[0].get_visible_maddrs()]
        dhts += [DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=bootstrap) for _ in range(peers - 1)]
        averagers += [PseudoGradientAverager(
            state_provider=lambda: ({"epoch": 0}, [torch.zeros(SIZE)]), averaged_tensors=[torch.zeros(SIZE)], dht=dht,
            prefix=PREFIX, min_matchmaking_time=3.0, request_timeout=1.5, allreduce_timeout=round_timeout_s, start=True,
            robust=RobustOptions.for_pseudo_gradients(max_weight=1e6, inner_lr=1e-3, rounds_held=1.0, parameter_count=1))
            for dht in dhts]
        rounds_s = []
        for epoch in range(3):
            controls = _scheduled_round(averagers, epoch, round_timeout_s)
            began = time.monotonic()
            _trigger(controls)
            sizes = [len(control.result(timeout=round_timeout_s + 30)) for control in controls]
            rounds_s.append(time.monotonic() - began)
            assert sizes == [peers] * peers, sizes
        controls = _scheduled_round(averagers, 3, round_timeout_s)
        stopped = averagers[-1].pid
        os.kill(stopped, signal.SIGSTOP)
        began = time.monotonic()
        _trigger(controls[:-1])
        averaged = 0
        for control in controls[:-1]:
            try:
                averaged += control.result(timeout=round_timeout_s + 30) is not None
            except Exception:  # the round failed for this peer (hivemind's fixed deadline: all of them)
                pass
        seconds = time.monotonic() - began
        mean = sum(range(1, peers)) / (peers - 1) * 1e-4
        with averagers[0].get_tensors() as tensors:
            at_mean = torch.isclose(tensors[0], torch.tensor(mean)).float().mean().item()
        return {"seconds": seconds, "averaged": averaged, "deadlines": [made.stall_deadline for made in averagers[:-1]],
                "mean": at_mean, "rounds_s": rounds_s}
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGCONT)
        for made in averagers:
            made.shutdown()
        for dht in dhts:
            dht.shutdown()


def _scheduled_round(averagers: list[PseudoGradientAverager], epoch: int, timeout_s: float) -> list:
    """Each averager's round of ``epoch`` (peer i averages 1e-4 x (i + 1)), scheduled ahead with hivemind's
    ``timeout_s`` as a worker schedules it; their controls once every group formed."""
    for index, made in enumerate(averagers):
        with made.get_tensors() as tensors:
            tensors[0].fill_(1e-4 * (index + 1))
    controls = [made.schedule_round(epoch, timeout_s) for made in averagers]
    deadline = time.monotonic() + 60
    while not all(control.stage == AveragingStage.AWAITING_TRIGGER for control in controls):
        assert time.monotonic() < deadline, [control.stage for control in controls]
        time.sleep(0.05)
    return controls


def _trigger(controls: list) -> None:
    for control in controls:
        control.weight = 1.0
        control.allow_allreduce()
