"""Real sync trainers for tests: hivemind's optimizer as ``SyncTrainer`` runs it, on a DHT on 127.0.0.1.

A tiny parameter vector and a target batch no test reaches, so a test drives the rounds itself
(pre-schedules, triggers, reads the outcome) instead of waiting for the swarm's samples.
"""

from __future__ import annotations

import contextlib

import hivemind
import torch

from p2ptrain.peers.training.settings import SwarmSettings
from p2ptrain.peers.training.sync import SyncTrainer


def sync_trainer(dht, prefix: str, matchmaking_time: float = 3.0, averaging_timeout: float = 30.0) -> SyncTrainer:
    """A trainer of 8 zero parameters on ``dht`` in the run ``prefix``, 8 samples a step, uncompressed.

    Args:
        dht: its running hivemind DHT.
        prefix: the run's averaging prefix (trainers of one test share it).
        matchmaking_time, averaging_timeout: its averagers' timings, seconds.
    """
    parameters = [torch.nn.Parameter(torch.zeros(8))]
    return SyncTrainer(SwarmSettings(dht=dht, prefix=prefix, parameters=parameters, target_batch_size=10_000,
                                     batch_size_per_step=8, inner_lr=1e-3, compression="none",
                                     matchmaking_time=matchmaking_time, averaging_timeout=averaging_timeout))


@contextlib.contextmanager
def sync_pair(prefix: str, averaging_timeout: float = 30.0):
    """Two ``sync_trainer``s in the run ``prefix``, each on its own DHT on 127.0.0.1 (the second bootstrapped
    from the first), with ``averaging_timeout``; yields ``(first_trainer, second_trainer, first_dht)``; all shut
    down on leaving the block."""
    first = hivemind.DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    second = hivemind.DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=first.get_visible_maddrs())
    trainers = []
    try:
        trainers.append(sync_trainer(first, prefix, averaging_timeout=averaging_timeout))
        trainers.append(sync_trainer(second, prefix, averaging_timeout=averaging_timeout))
        yield trainers[0], trainers[1], first
    finally:
        for trainer in trainers:
            trainer.shutdown()
        second.shutdown()
        first.shutdown()
