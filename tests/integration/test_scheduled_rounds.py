"""Sync mode's pre-scheduled gradient rounds (one real averager on 127.0.0.1, no swarm)."""

from __future__ import annotations

import hivemind
import torch

from p2ptrain.peers.robust_reduce import RobustOptions
from p2ptrain.peers.sync import CountingGradientAverager


def test_a_pre_scheduled_gradient_round_counts_nothing_until_triggered():
    """hivemind's optimizer may cancel a pre-scheduled round that still runs (see
    ``CountingGradientAverager.schedule_step``): until the step that triggers it sets its
    samples, its weight is 0, not hivemind's default 1."""
    dht = hivemind.DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    averager = CountingGradientAverager([torch.nn.Parameter(torch.zeros(4))], dht=dht, prefix="scheduled_grad_averager",
                                        start=True, robust=RobustOptions.for_gradients(max_weight=640.0))
    try:
        control = averager.schedule_step(timeout=5.0)
        assert control.weight == 0.0
        control.cancel()
    finally:
        averager.shutdown()
        dht.shutdown()
