"""Whether a state downloaded from a peer may replace this peer's own.

A peer that is behind downloads the swarm's state (DiLoCo: the global
parameters, the outer momentum and the epoch; sync: the parameters, the
optimizer's statistics and the epoch) from the peer that announces the highest
epoch, which any peer can claim to be. ``RobustAverager`` checks every download
here and, when one is refused, tries the next peer. The bound:

1. the same number of tensors of the same shapes, every value finite
   (``checkpoint.state_problem``);
2. the parameters' overall L2 norm within ``MAX_NORM_RATIO`` (8) times ours
   either way: training moves a model, it does not rescale it eight-fold
   (this refuses noise, constants and zeros);
3. unless this peer has not trained yet (its epoch is 0: it has nothing of its
   own to compare with), the parameters at most ``MAX_RELATIVE_DISTANCE`` (1.0)
   times our parameters' norm away from ours, in L2 (``|theta_theirs -
   theta_ours| <= |theta_ours|``): peers that train together differ by a few
   epochs of updates, a small fraction of that (this refuses sign flips and
   unrelated parameters). A state refused only by this distance is still taken
   when a second peer serves the same one (within ``AGREEMENT`` of it): a peer
   back from a long absence can then catch up with a swarm that moved far.

Only the first ``parameter_count`` tensors of a state are parameters
(``RobustOptions.parameter_count``); the rest (momentum, optimizer statistics)
pass checks 1 only.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from p2ptrain.peers.checkpoint import state_problem

MAX_NORM_RATIO = 8.0
MAX_RELATIVE_DISTANCE = 1.0
AGREEMENT = 0.01


def norm(tensors: Sequence[torch.Tensor]) -> float:
    """The L2 norm of all the tensors together."""
    return math.sqrt(sum(float(tensor.detach().float().pow(2).sum()) for tensor in tensors))


def relative_distance(theirs: Sequence[torch.Tensor], ours: Sequence[torch.Tensor]) -> float:
    """``|theirs - ours| / |ours|`` over all the tensors together (infinity when ours is zero and theirs is not)."""
    difference = norm([their.detach().float() - our.detach().float() for their, our in zip(theirs, ours)])
    ours_norm = norm(ours)
    if ours_norm == 0:
        return 0.0 if difference == 0 else math.inf
    return difference / ours_norm


def broken_state(ours: Sequence[torch.Tensor], theirs: Sequence[torch.Tensor], parameter_count: int) -> str | None:
    """Why ``theirs`` can never replace ``ours`` (checks 1 and 2), or None."""
    problem = state_problem(list(ours), list(theirs))
    if problem is not None:
        return problem
    our_norm, their_norm = norm(ours[:parameter_count]), norm(theirs[:parameter_count])
    if our_norm > 0 and not (our_norm / MAX_NORM_RATIO <= their_norm <= our_norm * MAX_NORM_RATIO):
        return f"its parameters' norm is {their_norm / our_norm:.3g} times ours (allowed: 1/{MAX_NORM_RATIO:g} to {MAX_NORM_RATIO:g})"
    return None


def far_state(ours: Sequence[torch.Tensor], theirs: Sequence[torch.Tensor], parameter_count: int, our_epoch: int) -> float | None:
    """The relative distance of the parameters when it breaks check 3, else None."""
    if our_epoch <= 0:
        return None
    distance = relative_distance(theirs[:parameter_count], ours[:parameter_count])
    return distance if distance > MAX_RELATIVE_DISTANCE else None


def same_state(first: Sequence[torch.Tensor], second: Sequence[torch.Tensor], parameter_count: int) -> bool:
    """True when two downloaded states agree (their parameters within ``AGREEMENT`` of each other)."""
    return relative_distance(second[:parameter_count], first[:parameter_count]) <= AGREEMENT
