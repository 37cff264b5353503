"""Error feedback: what a peer did not send of its pseudo-gradients is sent in later rounds.

On a sparse rung a peer sends a few entries of each pseudo-gradient
(``compression_sparse.sparsify``). The rest is not lost: it is kept in a
*residual* and added to the next round's pseudo-gradient, so what the peer
contributes over the rounds adds up to what it trained
(Seide et al. 2014, Karimireddy et al. 2019; SparseLoCo, Sarfi et al. 2025):

    target = decay * residual + pseudo_gradient
    sent = sparsify(target)
    residual = target - sent

With ``decay`` 1 this is exact: the sum of what was sent over the rounds plus
the last residual equals the sum of the pseudo-gradients (to float rounding).
A ``decay`` below 1 forgets old residuals geometrically (SparseLoCo's beta,
which stands in for DiLoCo's outer momentum); it is the manifest's
``error_feedback_decay``.

The residuals are one float32 copy of the trainable parameters, in RAM (beside
DiLoCo's global parameters), and go into the peer's checkpoint.

A round that finds no group sent nothing that counts: :meth:`ErrorFeedback.not_sent`
puts the residual back as it was, so the round's pseudo-gradient is neither lost
to the residual nor counted twice when the peer's local progress (kept for the
next round, ``diloco.py``) is sent again.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from p2ptrain.peers.compression.ladder import Rung
from p2ptrain.peers.compression.sparse import sparsify


def rounds_held(rungs: Sequence[Rung], decay: float) -> float:
    """How many rounds' worth of pseudo-gradient one value a peer sends can hold, in a run
    that allows ``rungs`` (robust aggregation bounds what an honest value can be by it,
    ``robust_reduce``): 1 when no rung is sparse; else the residual's geometric sum
    ``1 / (1 - decay)``, and no bound at ``decay`` 1 (an entry that is never among the
    largest waits as long as it takes, growing all the while).
    """
    if not any(rung.sparse for rung in rungs):
        return 1.0
    return math.inf if decay >= 1 else 1.0 / (1.0 - decay)


class ErrorFeedback:
    """One peer's residuals for a rung; on a dense rung it passes pseudo-gradients through.

    Args:
        rung: the rung this peer sends with.
        shapes_like: tensors shaped like the averaged ones (the global parameters).
        decay: what share of the residual is carried into the next round (1: all of it).
    """

    def __init__(self, rung: Rung, shapes_like: Sequence[torch.Tensor], decay: float = 1.0):
        if not 0 < decay <= 1:
            raise ValueError(f"error feedback decay {decay} is out of range; use a number in (0, 1]")
        self.rung, self.decay = rung, decay
        self.residuals = [torch.zeros_like(tensor, dtype=torch.float32, device="cpu") for tensor in shapes_like] if rung.sparse else []
        self._pending: list[torch.Tensor] | None = None

    @torch.no_grad()
    def outgoing(self, pseudo_gradients: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """What this peer sends this round for ``pseudo_gradients``; settle it with
        :meth:`sent` or :meth:`not_sent` once the round is over."""
        if not self.rung.sparse:
            return list(pseudo_gradients)
        targets = [self.decay * residual + gradient.float().cpu() for residual, gradient in zip(self.residuals, pseudo_gradients)]
        outgoing = [sparsify(target, self.rung) for target in targets]
        self._pending = [target - sent for target, sent in zip(targets, outgoing)]
        return outgoing

    @torch.no_grad()
    def everything(self, pseudo_gradients: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The pseudo-gradients with the whole residual added, which empties it: for a peer
        that steps alone (nothing is sent, so nothing needs to be left out)."""
        if not self.rung.sparse:
            return list(pseudo_gradients)
        total = [self.decay * residual + gradient.float().cpu() for residual, gradient in zip(self.residuals, pseudo_gradients)]
        for residual in self.residuals:
            residual.zero_()
        self._pending = None
        return total

    def sent(self) -> None:
        """The round's average was adopted: what was not sent becomes the residual."""
        if self._pending is not None:
            self.residuals, self._pending = self._pending, None

    def not_sent(self) -> None:
        """The round did not count: the residual stays as it was before it."""
        self._pending = None

    def state_dict(self) -> dict:
        """The residuals for a checkpoint. While a round is in flight, what that round leaves
        unsent: a restored trainer drops the round's local progress (the swarm may have
        adopted it), so the residual must not hold the part it sent either."""
        residuals = self._pending if self._pending is not None else self.residuals
        return {"rung": self.rung.name, "decay": self.decay, "residuals": [residual.clone() for residual in residuals]}

    def load_state_dict(self, state: dict | None) -> None:
        """Restore residuals saved by :meth:`state_dict` (kept across a change to another sparse
        rung: a residual is what was trained and not sent, whatever the rung)."""
        saved = (state or {}).get("residuals") or []
        if not self.rung.sparse or len(saved) != len(self.residuals):
            return
        with torch.no_grad():
            for target, source in zip(self.residuals, saved):
                target.copy_(source)
