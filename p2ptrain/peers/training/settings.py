"""What both trainers are built from: the swarm and this peer's share in it, and the learning rate's schedule.

``SyncTrainer`` and ``DiLoCoTrainer`` take a ``SwarmSettings`` and an
``LrSchedule`` (``peers/worker/run_setup.py: make_trainer`` fills them from the
manifest and the worker's spec), plus what only their mode has.

Importable without torch or hivemind (the types are for type checkers only).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

    import torch

    from p2ptrain.peers.robust.trust import Trust

# set to 1 in a worker's environment, hivemind's optimizer writes its status lines (pre-scheduled rounds,
# epoch moves, out-of-sync checks, tagging along) at INFO, as at the DEBUG log level, hivemind's matchmaking
# writes its DEBUG lines (leaders asked and why they refused, groups assembled), and the progress tracker
# the records it reads: for labs (``benchmarks/scale.py --round-log``), without the rest of the DEBUG lines
ROUND_LOG_VARIABLE = "P2PTRAIN_ROUND_LOG"
MATCHMAKING_LOGGER = "hivemind.averaging.matchmaking"


def start_round_log() -> bool:
    """Turn the round log on when ``ROUND_LOG_VARIABLE`` asks for it: hivemind's matchmaking logs at DEBUG
    from here on, in this process and the averager processes it starts later; returns whether it is on."""
    wanted = os.environ.get(ROUND_LOG_VARIABLE) == "1"
    if wanted:
        logging.getLogger(MATCHMAKING_LOGGER).setLevel(logging.DEBUG)
    return wanted


@dataclasses.dataclass(frozen=True)
class SwarmSettings:
    """What every trainer needs to train in the swarm.

    Attributes:
        dht: the running hivemind DHT.
        prefix: ``averaging_prefix(manifest)``; peers average only within it.
        parameters: the trainable parameters (the local copy, inside the model; only these are averaged).
        target_batch_size: samples the swarm trains per epoch (sync) or round (DiLoCo).
        batch_size_per_step: samples this peer trains per ``step`` (micro-batch times gradient accumulation).
        inner_lr: the learning rate of this peer's optimizer (its peak, under a schedule).
        compression: what this peer averages with: the manifest's compression (sync), or the rung of the
            compression ladder this peer sends (DiLoCo).
        matchmaking_time: seconds peers spend forming an averaging group.
        averaging_timeout: seconds before a stuck averaging round is abandoned.
        client_mode: this peer cannot accept connections (behind NAT, no relay).
        trust: this peer's ``Trust`` (bans from earlier, suspects named in rounds); a fresh one when None.
    """

    dht: Any
    prefix: str
    parameters: Sequence[torch.nn.Parameter]
    target_batch_size: int
    batch_size_per_step: int
    inner_lr: float
    compression: str
    matchmaking_time: float
    averaging_timeout: float
    client_mode: bool = False
    trust: Trust | None = None


@dataclasses.dataclass(frozen=True)
class LrSchedule:
    """The learning rate over the run: ``warmup_epochs`` of linear warm-up, then ``lr_schedule``
    (``constant``, ``cosine`` or ``linear``) towards ``total_epochs`` (``optimizers.learning_rate_factor``)."""

    warmup_epochs: int = 0
    lr_schedule: str = "constant"
    total_epochs: int | None = None
