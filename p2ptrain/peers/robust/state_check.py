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
3. the parameters point the same way as ours: cosine similarity at least
   ``MIN_COSINE`` (0.1). Training keeps a model's direction: the tiny model
   trained from scratch for 800 AdamW steps at lr 3e-3 is still at 0.52 with its
   initial weights, while a sign flip is at -1 and unrelated parameters at 0
   (within 0.001 for a model of a million parameters);
4. a state that claims to be at most ``NEAR_EPOCHS`` (2) epochs ahead of ours
   lies within ``MAX_RELATIVE_DISTANCE`` (1.0) times our parameters' norm of
   ours, in L2: that is the common download (a failed round, a short pause),
   and peers move less than that in two epochs (the same tiny model: 0.26
   after 8 AdamW steps from its initial weights, 0.65 after 160; a DiLoCo run
   with outer momentum 0.9 moved 2.5 in 20 epochs of 8 steps, 0.13 an epoch).
   A state further ahead may be further away (a newcomer, a peer back from a
   long absence): checks 1-3 still hold.

A state refused by check 3 or 4 only is still taken when a second peer serves
the same one (within ``AGREEMENT``, 1 %, of it), and its peer is named only once
the peer's state is known to differ from one this peer took. Checks 1 and 2
name the peer at once.

Limits: a peer that claims to be many epochs ahead escapes check 4, and a newcomer
has only its initial weights to compare with: a crafted state near the run's
direction and size (not noise, a sign flip, a constant or zeros) can fool a
peer that downloads it, never the peers it averages with afterwards (their
reducers clip its pieces). Two colluding peers serving the same state pass the
second-peer rule.

Only the first ``parameter_count`` tensors of a state are parameters
(``RobustOptions.parameter_count``); the rest (momentum, optimizer statistics)
pass checks 1 only.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from p2ptrain.peers.model.checkpoint import state_problem

MAX_NORM_RATIO = 8.0
MIN_COSINE = 0.1
NEAR_EPOCHS = 2
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


def cosine(theirs: Sequence[torch.Tensor], ours: Sequence[torch.Tensor]) -> float:
    """The cosine similarity of all the tensors together (1.0 when either is zero: nothing to compare)."""
    dot = sum(float((their.detach().float() * our.detach().float()).sum()) for their, our in zip(theirs, ours))
    norms = norm(theirs) * norm(ours)
    return dot / norms if norms > 0 else 1.0


def broken_state(ours: Sequence[torch.Tensor], theirs: Sequence[torch.Tensor], parameter_count: int) -> str | None:
    """Why ``theirs`` can never replace ``ours`` (checks 1 and 2), or None."""
    problem = state_problem(list(ours), list(theirs))
    if problem is not None:
        return problem
    our_norm, their_norm = norm(ours[:parameter_count]), norm(theirs[:parameter_count])
    if our_norm > 0 and not (our_norm / MAX_NORM_RATIO <= their_norm <= our_norm * MAX_NORM_RATIO):
        return f"its parameters' norm is {their_norm / our_norm:.3g} times ours (allowed: 1/{MAX_NORM_RATIO:g} to {MAX_NORM_RATIO:g})"
    return None


def far_state(ours: Sequence[torch.Tensor], theirs: Sequence[torch.Tensor], parameter_count: int,
              epochs_ahead: int) -> tuple[str, float] | None:
    """Why ``theirs`` (``epochs_ahead`` epochs ahead of ours) breaks check 3 or 4, with the
    ratio past the bound, or None when it passes."""
    direction = cosine(theirs[:parameter_count], ours[:parameter_count])
    if direction < MIN_COSINE:
        return f"its parameters' cosine similarity with ours is {direction:.3g} (allowed: at least {MIN_COSINE:g})", 1 - direction
    if epochs_ahead <= NEAR_EPOCHS:
        distance = relative_distance(theirs[:parameter_count], ours[:parameter_count])
        if distance > MAX_RELATIVE_DISTANCE:
            return (f"its parameters are {distance:.3g} times our parameters' norm away from ours at {epochs_ahead} "
                    f"epoch(s) ahead (allowed: {MAX_RELATIVE_DISTANCE:g})"), distance
    return None


def same_state(first: Sequence[torch.Tensor], second: Sequence[torch.Tensor], parameter_count: int) -> bool:
    """True when two downloaded states agree (their parameters within ``AGREEMENT`` of each other)."""
    return relative_distance(second[:parameter_count], first[:parameter_count]) <= AGREEMENT
