"""Robust aggregation: what one reducer of an averaging round makes of the pieces its group sends.

hivemind's butterfly all-reduce gives every member of a group one part of the
tensors to reduce: each member sends that reducer its piece of the part, the
reducer combines the pieces and sends the result back. hivemind combines them
with a weighted mean, which a single sender can drag anywhere. Here a reducer
combines them with **CenteredClip** (Karimireddy et al. 2021; the aggregator of
BTARD, Gorbunov et al., "Secure Distributed Training at Scale", 2022, from
hivemind's authors):

    v <- v + sum_i w_i * clip(x_i - v, tau) / sum_i w_i,   clip(d, tau) = d * min(1, tau / |d|)

iterated from the coordinate-wise median of the pieces until it settles. Each
sender pulls the result toward its piece by at most ``tau``, however far away
the piece is. Why CenteredClip and not "clip each piece to a multiple of the
median norm": the median *norm* is the wrong scale for state averaging, whose
pieces are parameters (large, nearly equal across honest peers), where a clip
radius of a few parameter norms lets a sender move the model by that much;
CenteredClip's radius is a distance between pieces, small wherever honest
peers agree.

The clip radius needs no tuning: ``tau = CLIP_RADIUS_MULTIPLE`` (4) times the
median distance of the pieces from their coordinate-wise median, so it scales
with how much honest peers differ in this part.

**The bound.** While no honest piece is clipped, the result lies within
``(W_bad / W_honest) * tau`` of the honest pieces' weighted mean, whatever the
other senders send (W: the senders' weights as they count, see below): at the
fixed point the honest pieces' pull balances the others' clipped pull, at most
``W_bad * tau``. One sender among three thus moves a part by at most one clip
radius (4 median distances); the weighted mean moves without limit. With
nobody misbehaving nothing is clipped in practice (honest pieces sit about one
median distance from the median, a quarter of ``tau``) and the result *is* the
weighted mean: the fixed point of the iteration when no piece is clipped.
``tests/unit/test_robust_reduce.py`` measures both.

**Weights.** A sender's weight (its claimed sample count) counts at most
``WEIGHT_MEDIAN_MULTIPLE`` (2) times the median weight of the part's senders
(the upper median: with two senders the larger), so one sender among three
never holds more than half of the weight, and no more than ``max_weight``
(what a round can plausibly hold, set by the averager's owner). A weight that
is not a finite number >= 0, or above ``max_weight``, names its sender. A
sender with weight 0 (hivemind's "tag along" of a peer that only wants the
result) does not count at all.

**What no honest peer can send.** Some pieces are left out whatever the group
thinks: NaN or infinity; a weight that is not a finite number >= 0 or above
``max_weight``; the same piece as the sender sent in an earlier round
(``robust_allreduce.ReplayMemory``); and a pseudo-gradient with a value above
*its own weight's bound* (``RobustOptions.max_element``). A pseudo-gradient
holds the inner steps of exactly the samples its weight counts (both kinds of
DiLoCo rounds send ``pending_samples``: the round's samples plus those kept
over rounds without a group, re-based after a download, or trained while the
previous round was averaged), every step takes at least
``MIN_SAMPLES_PER_STEP`` (1) sample, whatever micro-batch a planner picks, and
an inner AdamW step moves a value by at most about ``PLAUSIBLE_STEP`` (4)
peak learning rates. So an honest piece of weight ``w`` holds no value above

    PLAUSIBLE_STEP x inner_lr x w / MIN_SAMPLES_PER_STEP x rounds_held

(``rounds_held``: on a sparse rung, the rounds' worth the error feedback's
residual can hold, ``error_feedback.rounds_held``; no bound at decay 1). The
``w`` is the weight *as it counts* (below): a sender that claims a huge
weight is judged by twice the median weight, so claiming buys it no room. A
piece past its bound is left out and names its sender (``implausible-update``);
a sender with weight 0 does not count and is not judged. The bound is loose
for honest peers (their micro-batches hold several samples, and Adam moves a
value by about one learning rate per step, less once trained, in directions
that partly cancel over steps), and tight enough for attacks: a constant 1.0
or noise of an update's scale times a thousand is far past it. Its limits: a
peer that trained more than twice the median's samples (a fast one) is judged
by twice the median, so it holds while its steps are fewer than that (its
micro-batches of at least its share over twice the median); and a rogue that
claims twice the median weight and stays within that weight's bound is only
clipped, not named.

**Results from other reducers.** Every part is reduced by one member, which
can return anything. A reducer's result is a combination of the pieces it
counted (CenteredClip moves each value only between the pieces' values), so no
honest result holds a value above the bound of the largest weight counted in
the group, ``largest_weight`` (this peer's own reducer sees every sender's
weight with its pieces; a peer that reduces nothing, a client, uses
``max_weight``'s bound). ``robust_allreduce`` refuses (keeps this peer's own
piece, names the reducer ``bad-result``) a result past that bound, and any
result from a peer this peer's reducer named as a sender in the same round.
Where ``far_from_own`` is set it also refuses a result farther from this
peer's own piece than ``far_from_own`` times that piece's norm, but only when
this peer sent its piece with a weight above 0. A peer tagging along with
weight 0 sends whatever its buffers hold, not its current values (hivemind's
tag-along before a state download sends the last round's average; a
pre-scheduled sync round that the host dropped can still run, see
``sync.CountingGradientAverager``): an honest result can be any distance from
that (16 times the stale piece's norm, measured), and the peer does not use
the result anyway. A peer that counts compares its current piece: honest
results stay within about one norm of it (batch noise; 1.0 at most measured
on the tiny model, 4 samples against 60), and a rogue's flip, scale or
constant is still refused there.

**Two senders.** With two pieces there is no majority: each is as far from the
median as the other. When the reducer is one of the two and ``far_from_own``
is set, its own piece is the one it trusts: the other is left out (the result
is the reducer's own piece) when it is farther from the reducer's piece than
``far_from_own`` times that piece's norm. For gradients, a part's norm in
these checks is at least the norm it would have if the peer's whole gradient
were spread evenly (``RobustOptions.floor_from_whole``): where one tensor's
gradient passes near zero, batch noise or a late peer's stale gradient is many
times that tensor's own norm (up to 56 times, measured), not the whole gradient's.

**Naming.** Every piece left out names its sender (``Aggregate.suspects``,
with the reason and the ratio past the bound). So does a piece that ends
farther than ``SUSPECT_RATIO`` (4) clip radii from the result (16 median
distances), and farther than ``far_from_own`` times the result's norm, when
``name_outliers`` is set: for gradients and parameters, whose honest sizes
agree (parameters that differ by a fraction of their size, as after one peer stepped on
its own gradients, are many clip radii apart where the others agree exactly:
clipped, not named); not for pseudo-gradients, whose honest sizes differ a
hundredfold (Adam's first steps after a start move every parameter by the full
learning rate, a trained Adam far less), so a large one is only clipped.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping

import torch

CLIP_RADIUS_MULTIPLE = 4.0
# a sender claiming more samples than this many rounds' worth is named (``plausible_weight``)
PLAUSIBLE_ROUNDS = 100
# Adam moves a parameter by at most about (1 - beta1) / sqrt(1 - beta2) ~ 3.2 learning rates in
# a step (1 in the usual case): a pseudo-gradient value above this many lr per step is no one's
PLAUSIBLE_STEP = 4.0
# the fewest samples an inner step trains on (a planner's smallest micro-batch, no accumulation)
MIN_SAMPLES_PER_STEP = 1
SUSPECT_RATIO = 4.0
# state rounds (parameters): another piece, or a reducer's result, is far when farther from ours than
# this times our norm. Honest peers that took a step or two on their own gradients (rounds they lost)
# were 0.13-0.32 apart on the tiny model under load (at 0.1 they named each other and refused the very
# round that brings them together); the catalogue's attacks are 1 (a constant) to 50 (a scaled flip)
PARAMETERS_FAR_FROM_OWN = 0.5
WEIGHT_MEDIAN_MULTIPLE = 2.0
MAX_ITERATIONS = 20
# the iteration has settled when a step moves the result by less than this fraction of tau
SETTLED = 1e-4

# why a sender is named (the ``reason`` of a ``suspect-peer`` event)
OUTLIER = "outlier"  # its piece was clipped hard
NON_FINITE = "non-finite"  # its piece held NaN or infinity
BAD_WEIGHT = "implausible-weight"  # its claimed weight was not finite, negative or above max_weight
IMPLAUSIBLE = "implausible-update"  # its piece held a value above its weight's max_element
FAR_FROM_OWN = "far-from-own"  # in a group of two, its piece was far from the reducer's own
REPLAYED = "replayed"  # it sent the same piece as in an earlier round (robust_allreduce)
BAD_RESULT = "bad-result"  # as a reducer it returned a result we refused (robust_allreduce)
BAD_STATE = "bad-state"  # it served a state we refused (state_check)


@dataclasses.dataclass(frozen=True)
class RobustOptions:
    """How an averager's reducers judge the pieces they get, and its senders the
    results they get back (one per averager; see the module doc).

    Args:
        max_weight: the most samples a sender can plausibly claim in one round;
            a larger claim is capped there and names the sender (None: no cap).
        max_element_per_sample: the largest value an honest piece can hold per sample
            of its weight (None: no bound); see ``max_element``.
        far_from_own: in a group of two, the other sender's piece is left out when
            it is farther from ours than this many times our piece's norm, and a
            part reduced by another peer is refused (ours kept) on the same bound
            (None: no such check).
        floor_from_whole: where ``far_from_own`` measures against a part's norm (ours,
            or the result's), take that norm as at least the one the part would have
            if our whole piece (every value of the round) were spread evenly over it:
            ``own_rms`` x sqrt(values in the part). Gradients: a tensor whose gradient
            passes near zero made an honest piece "far" from ours (see ``for_gradients``).
        name_outliers: name senders whose pieces are clipped hard.
        detect_replays: name a sender that sends exactly what it sent in an earlier
            round (meaningful for updates, not for parameters that barely move).
        parameter_count: how many leading tensors of this averager's shared state
            are parameters (``state_check`` compares those on a download); None:
            none are (the gradient averager: a download is only checked for
            shapes and NaN).
    """

    max_weight: float | None = None
    max_element_per_sample: float | None = None
    far_from_own: float | None = None
    floor_from_whole: bool = False
    name_outliers: bool = True
    detect_replays: bool = True
    parameter_count: int | None = None

    def max_element(self, weight: float) -> float | None:
        """The largest value an honest piece counted at ``weight`` (or a result whose
        largest counted weight is ``weight``) can hold; None: no bound."""
        if self.max_element_per_sample is None:
            return None
        return self.max_element_per_sample * weight

    def reference_norm(self, part_norm: float, size: int, own_rms: float) -> float:
        """The norm ``far_from_own`` multiplies for a part of ``size`` values whose norm is
        ``part_norm`` (ours, or the result's), when our whole piece's root mean square is
        ``own_rms`` (0: unknown); see ``floor_from_whole``."""
        return max(part_norm, own_rms * math.sqrt(size)) if self.floor_from_whole else part_norm

    @classmethod
    def for_pseudo_gradients(cls, max_weight: float, inner_lr: float, rounds_held: float, parameter_count: int) -> "RobustOptions":
        """DiLoCo's pseudo-gradients: at most one inner step per ``MIN_SAMPLES_PER_STEP`` samples of
        their weight, at (peak) ``inner_lr``, each value sent holding up to ``rounds_held`` rounds'
        worth (``error_feedback.rounds_held``; no bound when infinite). See the module doc."""
        per_sample = PLAUSIBLE_STEP * inner_lr * rounds_held / MIN_SAMPLES_PER_STEP if math.isfinite(rounds_held) else None
        return cls(max_weight=max_weight, max_element_per_sample=per_sample, name_outliers=False,
                   detect_replays=True, parameter_count=parameter_count)

    @classmethod
    def for_gradients(cls, max_weight: float) -> "RobustOptions":
        """Sync mode's averaged gradients: honest ones differ by about their own size (batch noise),
        judged against the whole gradient's scale where a part's own is smaller.

        Measured on the tiny model (``benchmarks/gradient_distance.py``, two peers, 32 samples each
        per epoch, 25 epochs, 3 seeds): the worst tensor's distance between the two peers' gradients,
        over our own tensor's norm, was up to 6.2 for fresh gradients, 28 for one epoch stale and 56
        for two (a late peer's kept gradients, ``SyncOptimizer``), where that tensor's own gradient
        passed near zero; against the floor of ``floor_from_whole``, 3.0, 6.0 and 6.7. A rogue's
        flip, noise or constant stays tens to thousands of times past it."""
        return cls(max_weight=max_weight, far_from_own=10.0, floor_from_whole=True, detect_replays=True)

    @classmethod
    def for_parameters(cls, parameter_count: int) -> "RobustOptions":
        """Sync mode's state averaging: honest parameters differ by a fraction of their size.
        Not a tiny one: a peer that stepped on its own gradients (a round it lost) moved every
        value by up to Adam's learning rate, which on small freshly initialised weights is a tenth
        of a part's norm or more per step (0.13 measured between two honest peers)."""
        return cls(far_from_own=PARAMETERS_FAR_FROM_OWN, detect_replays=False, parameter_count=parameter_count)


def plausible_weight(samples_per_round: int) -> float:
    """The most samples a peer can plausibly claim in one round, for ``RobustOptions.max_weight``:
    ``PLAUSIBLE_ROUNDS`` rounds' worth (a round of ``samples_per_round`` samples)."""
    return float(PLAUSIBLE_ROUNDS * samples_per_round)


@dataclasses.dataclass
class Suspect:
    """Why one sender was named: ``reason`` (one of the constants above) and ``ratio``
    (how far past the bound: distance over the clip radius, claimed weight over
    ``max_weight``, distance over our piece's norm; infinity for NaN)."""

    reason: str
    ratio: float


@dataclasses.dataclass
class Aggregate:
    """A reducer's result for one part: ``result``, the per-sender ratio of distance
    from the result to the clip radius (``ratios``, for measurement), the senders
    it names (``suspects``, by sender index), and the largest weight it counted
    (``largest_weight``: what bounds the group's results, see the module doc)."""

    result: torch.Tensor
    ratios: dict[int, float]
    suspects: dict[int, Suspect]
    largest_weight: float = 0.0


def bounded_weights(weights: Mapping[int, float], max_weight: float | None) -> tuple[dict[int, float], dict[int, Suspect]]:
    """The weights as they count (see the module doc), and the senders named for theirs."""
    counted, suspects = {}, {}
    for sender, weight in weights.items():
        weight = float(weight)
        if not math.isfinite(weight) or weight < 0:
            suspects[sender] = Suspect(BAD_WEIGHT, math.inf)
            weight = 0.0
        elif max_weight is not None and weight > max_weight:
            suspects[sender] = Suspect(BAD_WEIGHT, weight / max_weight)
            weight = max_weight
        counted[sender] = weight
    positive = sorted(weight for weight in counted.values() if weight > 0)
    if positive:
        cap = WEIGHT_MEDIAN_MULTIPLE * positive[len(positive) // 2]
        counted = {sender: min(weight, cap) for sender, weight in counted.items()}
    return counted, suspects


def coordinate_median(stacked: torch.Tensor) -> torch.Tensor:
    """The coordinate-wise median of the rows of ``stacked`` (the mean of the two middle values for an even count)."""
    ordered = stacked.sort(dim=0).values
    count = ordered.shape[0]
    if count % 2:
        return ordered[count // 2].clone()
    return (ordered[count // 2 - 1] + ordered[count // 2]) / 2


def centered_clip(stacked: torch.Tensor, weights: torch.Tensor, tau: float) -> torch.Tensor:
    """CenteredClip of the rows of ``stacked`` (shape senders x values) with ``weights``
    (positive) and clip radius ``tau`` > 0, from their coordinate-wise median."""
    result = coordinate_median(stacked)
    total = weights.sum()
    for _ in range(MAX_ITERATIONS):
        differences = stacked - result
        distances = differences.norm(dim=1)
        scale = torch.clamp(tau / distances.clamp_min(torch.finfo(distances.dtype).tiny), max=1.0)
        step = (weights * scale) @ differences / total
        result += step
        if float(step.norm()) <= SETTLED * tau:
            break
    return result


def robust_aggregate(
    pieces: Mapping[int, torch.Tensor], weights: Mapping[int, float], *, own: int | None, options: RobustOptions,
    own_rms: float = 0.0,
) -> Aggregate:
    """Combine the senders' pieces of one part (see the module doc).

    Args:
        pieces: each sender's piece, by sender index (same shape).
        weights: each sender's claimed weight, by sender index.
        own: the index of the reducer's own piece among the senders, or None.
        options: the averager's ``RobustOptions``.
        own_rms: the root mean square of this peer's whole piece in the round (every
            value it averages; 0: unknown), for ``RobustOptions.floor_from_whole``.
    """
    finite, suspects = {}, {}
    for sender, piece in pieces.items():
        if bool(torch.isfinite(piece).all()):
            finite[sender] = piece.detach().float().reshape(-1)
        else:
            suspects[sender] = Suspect(NON_FINITE, math.inf)
    counted, weight_suspects = bounded_weights({sender: weights[sender] for sender in finite}, options.max_weight)
    suspects.update(weight_suspects)
    plausible = {}
    for sender, piece in finite.items():
        # a sender that does not count is not judged: a peer tagging along sends whatever its buffers hold
        problem = too_large(piece, options.max_element(counted[sender])) if counted[sender] > 0 else None
        if problem is None:
            plausible[sender] = piece
        else:
            suspects[sender] = worse_suspect(suspects.get(sender), problem)
    shape = next(iter(pieces.values())).shape
    active = sorted(sender for sender in plausible if counted[sender] > 0)
    if not active:
        # no sender counts (all tagged along with weight 0): the plain mean of what is finite
        result = torch.stack([plausible[sender] for sender in sorted(plausible)]).mean(dim=0) if plausible else torch.zeros(shape).reshape(-1)
        return Aggregate(result.reshape(shape), {}, suspects)
    largest_weight = max(counted[sender] for sender in active)
    if len(active) == 2 and own in active and options.far_from_own is not None:
        return _two_senders(plausible, counted, active, own, options, own_rms, suspects, shape, largest_weight)

    stacked = torch.stack([plausible[sender] for sender in active])
    weight_tensor = torch.tensor([counted[sender] for sender in active], dtype=stacked.dtype)
    distances = (stacked - coordinate_median(stacked)).norm(dim=1)
    tau = CLIP_RADIUS_MULTIPLE * float(distances.median())
    if tau <= 0:
        # at least half of the pieces are identical: that is the result (honest pieces can
        # differ where most are zero, parameters that few batches touch: nobody is named)
        return Aggregate(coordinate_median(stacked).reshape(shape), {}, suspects, largest_weight)
    result = centered_clip(stacked, weight_tensor, tau)
    ratios = {}
    # where honest pieces nearly agree (parameters) a tiny difference is many clip radii: name only a large one
    significant = 0.0 if options.far_from_own is None else (
        options.far_from_own * options.reference_norm(float(result.norm()), result.numel(), own_rms))
    for sender, distance in zip(active, (stacked - result).norm(dim=1).tolist()):
        ratios[sender] = distance / tau
        if options.name_outliers and ratios[sender] >= SUSPECT_RATIO and distance > significant:
            suspects.setdefault(sender, Suspect(OUTLIER, ratios[sender]))
    return Aggregate(result.reshape(shape), ratios, suspects, largest_weight)


def too_large(values: torch.Tensor, max_element: float | None) -> Suspect | None:
    """``implausible-update`` when ``values`` (finite) hold a value above ``max_element`` (None: no bound), else None."""
    if max_element is None or not values.numel():
        return None
    largest = float(values.detach().abs().max())
    return Suspect(IMPLAUSIBLE, largest / max_element) if largest > max_element else None


def bad_result(own_piece: torch.Tensor, result: torch.Tensor, largest_weight: float | None, options: RobustOptions,
               *, own_weight: float, own_rms: float = 0.0) -> Suspect | None:
    """Why a part another reducer returned cannot be an honest reducer's (``bad-result``), or None.

    Args:
        own_piece: this peer's piece of the part (what it sent).
        result: the part as the reducer returned it.
        largest_weight: the largest weight counted in the group, as this peer's own reducer
            saw the senders' weights (None: unknown, ``max_weight`` is used).
        options: the averager's ``RobustOptions``.
        own_weight: the weight this peer sent its piece with; at 0 (tagging along) its piece
            is not its current values, and the result is not compared with it (see the module doc).
        own_rms: as ``robust_aggregate``'s.
    """
    if not bool(torch.isfinite(result).all()):
        return Suspect(BAD_RESULT, math.inf)
    weight = largest_weight if largest_weight is not None else options.max_weight
    if weight is not None:
        problem = too_large(result, options.max_element(weight))
        if problem is not None:
            return Suspect(BAD_RESULT, problem.ratio)
    own_norm = options.reference_norm(float(own_piece.norm()), own_piece.numel(), own_rms)
    distance = float((result - own_piece).norm())
    if options.far_from_own is not None and own_weight > 0 and 0 < own_norm and options.far_from_own * own_norm < distance:
        return Suspect(BAD_RESULT, distance / own_norm)
    return None


def worse_suspect(current: Suspect | None, new: Suspect) -> Suspect:
    """Of two reasons to name a peer (``current`` may be None), the one farther past its bound."""
    return new if current is None or new.ratio > current.ratio else current


def _two_senders(plausible, counted, active, own, options, own_rms, suspects, shape, largest_weight) -> Aggregate:
    """Two senders, one of them the reducer: keep the other's piece only if it is near ours."""
    other = active[0] if active[1] == own else active[1]
    own_norm = options.reference_norm(float(plausible[own].norm()), plausible[own].numel(), own_rms)
    distance = float((plausible[other] - plausible[own]).norm())
    if own_norm > 0 and distance > options.far_from_own * own_norm:
        suspects.setdefault(other, Suspect(FAR_FROM_OWN, distance / own_norm))
        return Aggregate(plausible[own].clone().reshape(shape), {}, suspects, largest_weight)
    total = counted[own] + counted[other]
    result = (plausible[own] * counted[own] + plausible[other] * counted[other]) / total
    return Aggregate(result.reshape(shape), {}, suspects, largest_weight)
