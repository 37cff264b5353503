"""Pre-scheduled averaging rounds count nothing until triggered (one real averager on 127.0.0.1, no swarm).

A round scheduled ahead can be cancelled and still run (see
``sync.CountingGradientAverager.schedule_step``): until the step that triggers
it sets the samples it holds, its weight is 0, not hivemind's default 1, so
such a round only tags along.
"""

from __future__ import annotations

import hivemind
import pytest
import torch

from p2ptrain.peers.training.diloco import PseudoGradientAverager
from p2ptrain.peers.robust.reduce import RobustOptions
from p2ptrain.peers.training.sync import CountingGradientAverager

pytestmark = pytest.mark.swarm


@pytest.fixture
def dht():
    dht = hivemind.DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    yield dht
    dht.shutdown()


@pytest.mark.timeout(60)
def test_a_pre_scheduled_gradient_round_counts_nothing_until_triggered(dht):
    averager = CountingGradientAverager([torch.nn.Parameter(torch.zeros(4))], dht=dht, prefix="scheduled_grad_averager",
                                        start=True, robust=RobustOptions.for_gradients(max_weight=640.0))
    try:
        control = averager.schedule_step(timeout=5.0)
        assert control.weight == 0.0
        control.cancel()
    finally:
        averager.shutdown()


@pytest.mark.timeout(60)
def test_a_pre_scheduled_diloco_round_counts_nothing_until_triggered(dht):
    averager = PseudoGradientAverager(
        state_provider=lambda: ({"epoch": 0}, [torch.zeros(4)]), averaged_tensors=[torch.zeros(4)], dht=dht,
        prefix="scheduled_diloco", start=True,
        robust=RobustOptions.for_pseudo_gradients(max_weight=640.0, inner_lr=1e-3, rounds_held=1.0, parameter_count=1))
    try:
        control = averager.schedule_round(gather=0, timeout=5.0)
        assert control.weight == 0.0
        control.cancel()
    finally:
        averager.shutdown()
