"""A reducer's robust aggregation (``robust_reduce``) and replay memory, one attack at a time (no hivemind swarm).

Honest pieces are a shared update plus each peer's own noise, as honest
pseudo-gradients are; each attack test also checks that hivemind's plain
weighted mean of the same pieces is wrecked, so the test can fail.
"""

from __future__ import annotations

import math

import pytest
import torch

from p2ptrain.peers.robust.allreduce import MIN_REPLAY_EVIDENCE, ReplayMemory
from p2ptrain.peers.robust.reduce import (
    BAD_RESULT,
    BAD_WEIGHT,
    FAR_FROM_OWN,
    IMPLAUSIBLE,
    NON_FINITE,
    OUTLIER,
    RobustOptions,
    bad_result,
    bounded_weights,
    robust_aggregate,
)

SIZE = 4096
UPDATES = RobustOptions.for_gradients(max_weight=10_000.0)
# honest pieces below hold values up to ~4.5e-3: as if 8 steps at lr 1e-3 (of 10 samples and more)
PSEUDO_GRADIENTS = RobustOptions.for_pseudo_gradients(max_weight=10_000.0, inner_lr=1e-3, rounds_held=1.0, parameter_count=1)
# the bound of a piece per sample of its weight: PLAUSIBLE_STEP (4) x the inner lr
PER_SAMPLE = 4e-3


def honest_pieces(count: int, seed: int = 0, noise: float = 1.0) -> dict[int, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    shared = torch.randn(SIZE, generator=generator) * 1e-3
    return {index: shared + noise * 1e-3 * torch.randn(SIZE, generator=generator) for index in range(count)}


def weighted_mean(pieces: dict[int, torch.Tensor], weights: dict[int, float]) -> torch.Tensor:
    total = sum(weights.values())
    return sum(piece * weights[sender] for sender, piece in pieces.items()) / total


def relative_error(result: torch.Tensor, reference: torch.Tensor) -> float:
    return float((result - reference).norm() / reference.norm())


@pytest.mark.parametrize("count", [2, 3, 5, 8])
def test_with_nobody_misbehaving_the_result_is_the_weighted_mean_and_nobody_is_named(count):
    for seed in range(5):
        pieces = honest_pieces(count, seed)
        weights = {sender: float(10 + 7 * sender) for sender in pieces}
        aggregate = robust_aggregate(pieces, weights, own=0, options=UPDATES)
        assert relative_error(aggregate.result, weighted_mean(pieces, weights)) < 1e-5
        assert aggregate.suspects == {}
        # honest pieces sit well inside the clip radius
        assert all(ratio < 0.5 for ratio in aggregate.ratios.values())


def test_honest_pseudo_gradients_a_hundred_times_larger_are_clipped_but_not_named():
    """A peer whose Adam just started moves every parameter by the full learning rate: a
    pseudo-gradient a hundred times another's, honest all the same."""
    pieces = {sender: piece / 100 for sender, piece in honest_pieces(3, seed=3).items()}
    pieces[2] = pieces[2] * 100
    aggregate = robust_aggregate(pieces, {0: 10.0, 1: 10.0, 2: 10.0}, own=0, options=PSEUDO_GRADIENTS)
    assert aggregate.suspects == {} and aggregate.ratios[2] > 4
    pair = robust_aggregate({0: pieces[0], 1: pieces[2]}, {0: 10.0, 1: 10.0}, own=0, options=PSEUDO_GRADIENTS)
    assert pair.suspects == {} and torch.allclose(pair.result, (pieces[0] + pieces[2]) / 2)


@pytest.mark.parametrize("scale", [1000.0, -50.0])
def test_a_pseudo_gradient_no_optimizer_step_can_make_is_left_out_and_named_even_between_two(scale):
    honest = honest_pieces(2, seed=8)
    rogue = honest[1] * scale
    aggregate = robust_aggregate({0: honest[0], 1: rogue}, {0: 10.0, 1: 10.0}, own=0, options=PSEUDO_GRADIENTS)
    assert aggregate.suspects[1].reason == IMPLAUSIBLE and aggregate.suspects[1].ratio > 1
    assert torch.equal(aggregate.result, honest[0])


def test_a_pseudo_gradient_just_under_its_weights_bound_counts_and_just_over_is_named():
    honest = honest_pieces(3, seed=10)
    weights = {0: 10.0, 1: 10.0, 2: 10.0, 3: 10.0}
    for scale, named in ((0.99, False), (1.01, True)):
        piece = torch.full((SIZE,), scale * PER_SAMPLE * 10.0)
        aggregate = robust_aggregate({**honest, 3: piece}, weights, own=0, options=PSEUDO_GRADIENTS)
        if named:
            assert aggregate.suspects[3].reason == IMPLAUSIBLE and aggregate.suspects[3].ratio == pytest.approx(1.01)
            assert torch.allclose(aggregate.result, weighted_mean(honest, {0: 10.0, 1: 10.0, 2: 10.0}), atol=1e-7)
        else:
            # within its bound it counts (clipped to the others, as any far piece)
            assert aggregate.suspects == {} and 3 in aggregate.ratios
    # the bound grows with the weight: the same piece from a sender of twice the samples counts
    piece = torch.full((SIZE,), 1.5 * PER_SAMPLE * 10.0)
    heavier = robust_aggregate({**honest, 3: piece}, {**weights, 3: 20.0}, own=0, options=PSEUDO_GRADIENTS)
    assert heavier.suspects == {} and heavier.largest_weight == 20.0
    # a sender with weight 0 (tagging along) does not count and is not judged
    along = robust_aggregate({**honest, 3: torch.full((SIZE,), 1e6)}, {**weights, 3: 0.0}, own=0, options=PSEUDO_GRADIENTS)
    assert along.suspects == {} and along.largest_weight == 10.0


def test_a_huge_claimed_weight_does_not_raise_the_bound():
    """The bound is that of the weight as it counts: twice the median weight (20 here), not the claim."""
    honest = honest_pieces(3, seed=11)
    weights = {0: 10.0, 1: 10.0, 2: 10.0, 3: 5_000.0}  # within max_weight: not named for the weight itself
    over = robust_aggregate({**honest, 3: torch.full((SIZE,), 1.1 * PER_SAMPLE * 20.0)}, weights, own=0, options=PSEUDO_GRADIENTS)
    assert over.suspects[3].reason == IMPLAUSIBLE and over.suspects[3].ratio == pytest.approx(1.1)
    assert over.largest_weight == 10.0
    under = robust_aggregate({**honest, 3: torch.full((SIZE,), 0.9 * PER_SAMPLE * 20.0)}, weights, own=0, options=PSEUDO_GRADIENTS)
    assert under.suspects == {} and under.largest_weight == 20.0


def test_a_result_above_the_bound_of_the_groups_largest_weight_is_refused():
    """A reducer returns a combination of the pieces it counted: no value above the bound of the
    largest weight counted in the group; a plain mean with a rogue's constant in it has them."""
    honest = honest_pieces(3, seed=12)
    own = honest[0]
    bound = PER_SAMPLE * 20.0
    assert bad_result(own, weighted_mean(honest, {0: 10.0, 1: 20.0, 2: 10.0}), 20.0, PSEUDO_GRADIENTS, own_weight=10.0) is None
    assert bad_result(own, torch.full((SIZE,), 0.99 * bound), 20.0, PSEUDO_GRADIENTS, own_weight=10.0) is None
    refused = bad_result(own, torch.full((SIZE,), 1.01 * bound), 20.0, PSEUDO_GRADIENTS, own_weight=10.0)
    assert refused.reason == BAD_RESULT and refused.ratio == pytest.approx(1.01)
    # the plain mean of the test's constant rogue (1.0 at weight 32) among two honest peers is far past it
    plain = weighted_mean({**honest, 3: torch.full((SIZE,), 1.0)}, {0: 10.0, 1: 10.0, 2: 10.0, 3: 32.0})
    assert bad_result(own, plain, 20.0, PSEUDO_GRADIENTS, own_weight=10.0).ratio > 5
    # a peer whose reducer saw no weight (a client) judges by max_weight's bound; NaN is always refused
    assert bad_result(own, torch.full((SIZE,), 1.01 * bound), None, PSEUDO_GRADIENTS, own_weight=10.0) is None
    assert bad_result(own, torch.full((SIZE,), 1.01 * PER_SAMPLE * 10_000.0), None, PSEUDO_GRADIENTS, own_weight=10.0) is not None
    assert bad_result(own, torch.full((SIZE,), math.nan), 20.0, PSEUDO_GRADIENTS, own_weight=10.0).ratio == math.inf



def test_a_peer_tagging_along_does_not_judge_results_by_its_stale_piece():
    """A sync peer whose round ran at weight 0 sent whatever its buffers held: measured, a piece 16
    times smaller than the group's gradient and half aligned with it. The honest result (the other
    peer's gradient) is far from that piece; only a peer whose piece counts judges by the distance."""
    generator = torch.Generator().manual_seed(13)
    gradient = torch.randn(SIZE, generator=generator) * 1e-3
    stale = (gradient + 1.7 * torch.randn(SIZE, generator=generator) * 1e-3) / 32
    assert float((gradient - stale).norm()) > UPDATES.far_from_own * float(stale.norm())
    assert bad_result(stale, gradient, 40.0, UPDATES, own_weight=0.0) is None
    assert bad_result(stale, gradient, 40.0, UPDATES, own_weight=4.0).reason == BAD_RESULT
    # a peer that counts still refuses a rogue's flipped and scaled result, and an honest one passes
    honest = honest_pieces(2, seed=14)
    assert bad_result(honest[0], -50.0 * honest[1], 40.0, UPDATES, own_weight=4.0).reason == BAD_RESULT
    assert bad_result(honest[0], weighted_mean(honest, {0: 4.0, 1: 40.0}), 40.0, UPDATES, own_weight=4.0) is None
    # NaN is refused whatever the weight
    assert bad_result(stale, torch.full((SIZE,), math.nan), 40.0, UPDATES, own_weight=0.0).ratio == math.inf

def attack(name: str, honest: dict[int, torch.Tensor]) -> torch.Tensor:
    honest_mean = torch.stack(list(honest.values())).mean(dim=0)
    return {
        "scaled-noise": torch.randn(SIZE, generator=torch.Generator().manual_seed(9)) * float(honest_mean.abs().mean()) * 1000,
        "sign-flipped-scaled": -50 * honest_mean,
        "constant": torch.full((SIZE,), 1.0),
    }[name]


@pytest.mark.parametrize("name", ["scaled-noise", "sign-flipped-scaled", "constant"])
def test_a_rogue_piece_moves_the_result_by_at_most_the_clip_radius_and_is_named(name):
    honest = honest_pieces(3, seed=1)
    pieces = {**honest, 3: attack(name, honest)}
    weights = {sender: 10.0 for sender in pieces}
    honest_mean = weighted_mean(honest, {sender: 10.0 for sender in honest})
    aggregate = robust_aggregate(pieces, weights, own=0, options=UPDATES)
    assert aggregate.suspects[3].reason == OUTLIER and aggregate.suspects[3].ratio >= 4
    assert set(aggregate.suspects) == {3}
    # the plain mean is wrecked; the robust result stays within the module's bound of the honest mean:
    # (the rogue's weight / the honest weight) x the clip radius
    clip_radius = float((pieces[3] - aggregate.result).norm()) / aggregate.suspects[3].ratio
    assert float((aggregate.result - honest_mean).norm()) <= 10 / 30 * clip_radius * 1.001
    assert relative_error(weighted_mean(pieces, weights), honest_mean) > 10 * relative_error(aggregate.result, honest_mean)


def test_a_rogue_among_two_peers_is_left_out_by_the_reducer_it_sends_to():
    honest = honest_pieces(1, seed=2)
    pieces = {0: honest[0], 1: -50 * honest[0]}
    aggregate = robust_aggregate(pieces, {0: 10.0, 1: 10.0}, own=0, options=UPDATES)
    assert aggregate.suspects[1].reason == FAR_FROM_OWN
    assert torch.equal(aggregate.result, honest[0])
    near = robust_aggregate({0: honest[0], 1: honest[0] * 1.5}, {0: 10.0, 1: 10.0}, own=0, options=UPDATES)
    assert near.suspects == {} and torch.allclose(near.result, honest[0] * 1.25)


def test_between_two_peers_a_gradient_near_zero_is_judged_by_the_whole_gradients_scale():
    """Where our own gradient of one tensor passes near zero, the other peer's honest (or one or two
    epochs stale) gradient of it is many times that tensor's norm (26 measured): judged against the
    whole gradient's root mean square, it is averaged; a flip of a gradient of the usual size is
    still left out, and our own check of a reducer's result follows the same floor."""
    generator = torch.Generator().manual_seed(21)
    own_rms = 1e-3  # the whole gradient's scale, per value
    own = torch.randn(SIZE, generator=generator) * own_rms / 30  # this tensor's own gradient, near zero now
    other = torch.randn(SIZE, generator=generator) * own_rms * 0.6  # the other peer's, of the usual size
    assert float((other - own).norm()) > 10 * float(own.norm())  # past far_from_own x our piece's norm
    unfloored = robust_aggregate({0: own, 1: other}, {0: 32.0, 1: 32.0}, own=0, options=UPDATES)
    assert unfloored.suspects[1].reason == FAR_FROM_OWN  # (own_rms unknown: the old check)
    floored = robust_aggregate({0: own, 1: other}, {0: 32.0, 1: 32.0}, own=0, options=UPDATES, own_rms=own_rms)
    assert floored.suspects == {} and torch.allclose(floored.result, (own + other) / 2)
    typical = torch.randn(SIZE, generator=generator) * own_rms
    flipped = robust_aggregate({0: typical, 1: -50 * typical}, {0: 32.0, 1: 32.0}, own=0, options=UPDATES, own_rms=own_rms)
    assert flipped.suspects[1].reason == FAR_FROM_OWN and torch.equal(flipped.result, typical)
    assert bad_result(own, other, 64.0, UPDATES, own_weight=32.0, own_rms=own_rms) is None
    assert bad_result(own, other, 64.0, UPDATES, own_weight=32.0).reason == BAD_RESULT
    assert bad_result(typical, -50 * typical, 64.0, UPDATES, own_weight=32.0, own_rms=own_rms).reason == BAD_RESULT
    # parameters are judged by their own part only: the floor is the gradients'
    parameters = RobustOptions.for_parameters(parameter_count=1)
    assert parameters.reference_norm(1.0, SIZE, own_rms=1.0) == 1.0


def test_a_huge_claimed_weight_is_capped_and_named():
    honest = honest_pieces(3, seed=4)
    rogue = honest[0] * -3  # a modest sign flip: only the weight makes it dangerous
    pieces = {**honest, 3: rogue}
    weights = {0: 10.0, 1: 10.0, 2: 10.0, 3: 1e9}
    aggregate = robust_aggregate(pieces, weights, own=0, options=UPDATES)
    assert aggregate.suspects[3].reason == BAD_WEIGHT and aggregate.suspects[3].ratio == pytest.approx(1e5)
    # the plain mean is the rogue's piece; the robust one counts it as twice the median weight (20 of 50)
    assert relative_error(weighted_mean(pieces, weights), rogue) < 1e-6
    assert relative_error(aggregate.result, weighted_mean(pieces, {0: 10.0, 1: 10.0, 2: 10.0, 3: 20.0})) < 1e-5


def test_weights_count_at_most_twice_the_median():
    counted, suspects = bounded_weights({0: 10.0, 1: 12.0, 2: 500.0}, max_weight=None)
    assert counted == {0: 10.0, 1: 12.0, 2: 24.0} and suspects == {}
    counted, suspects = bounded_weights({0: 10.0, 1: math.nan, 2: -1.0}, max_weight=None)
    assert counted[1] == counted[2] == 0 and {suspect.reason for suspect in suspects.values()} == {BAD_WEIGHT}


def test_a_non_finite_piece_is_left_out_and_named():
    honest = honest_pieces(2, seed=5)
    poisoned = honest[0].clone()
    poisoned[7] = math.nan
    aggregate = robust_aggregate({**honest, 2: poisoned}, {0: 1.0, 1: 1.0, 2: 1.0}, own=0, options=UPDATES)
    assert aggregate.suspects[2].reason == NON_FINITE
    assert bool(torch.isfinite(aggregate.result).all())
    assert torch.allclose(aggregate.result, (honest[0] + honest[1]) / 2)


def test_a_sender_with_weight_zero_tags_along_without_counting():
    honest = honest_pieces(2, seed=6)
    aggregate = robust_aggregate({**honest, 2: torch.full((SIZE,), 1e6)}, {0: 1.0, 1: 3.0, 2: 0.0}, own=0, options=UPDATES)
    assert torch.allclose(aggregate.result, (honest[0] + 3 * honest[1]) / 4)


def test_parameters_that_agree_keep_a_rogue_parameter_piece_near_them():
    """State averaging: honest parameters almost equal, the rogue's clip radius is tiny."""
    parameters = torch.randn(SIZE)
    pieces = {0: parameters, 1: parameters + 1e-6 * torch.randn(SIZE), 2: -parameters}
    aggregate = robust_aggregate(pieces, {0: 1.0, 1: 1.0, 2: 1.0}, own=0, options=RobustOptions.for_parameters(1))
    assert aggregate.suspects[2].reason == OUTLIER
    assert relative_error(aggregate.result, parameters) < 1e-4


def test_parameters_that_differ_by_a_thousandth_are_clipped_not_named():
    """One peer stepped on its own gradients once: its parameters differ a little from two that agree exactly."""
    parameters = torch.randn(SIZE)
    pieces = {0: parameters, 1: parameters + 1e-9 * torch.randn(SIZE), 2: parameters + 1e-3 * torch.randn(SIZE)}
    aggregate = robust_aggregate(pieces, {0: 1.0, 1: 1.0, 2: 1.0}, own=0, options=RobustOptions.for_parameters(1))
    assert aggregate.ratios[2] > 4 and aggregate.suspects == {}


def test_between_two_peers_parameters_a_few_own_steps_apart_are_averaged_and_a_flip_is_not():
    """A state round of two: the other peer stepped on its own gradients (0.13 of the norm apart,
    as measured between two honest peers with 8-bit state rounds): averaged, nobody named."""
    parameters = 0.02 * torch.randn(SIZE)
    diverged = parameters + 0.13 * 0.02 * torch.randn(SIZE)
    aggregate = robust_aggregate({0: parameters, 1: diverged}, {0: 1.0, 1: 1.0}, own=0, options=RobustOptions.for_parameters(1))
    assert aggregate.suspects == {}
    assert relative_error(aggregate.result, (parameters + diverged) / 2) < 1e-6
    flipped = robust_aggregate({0: parameters, 1: -parameters}, {0: 1.0, 1: 1.0}, own=0, options=RobustOptions.for_parameters(1))
    assert flipped.suspects[1].reason == FAR_FROM_OWN
    assert relative_error(flipped.result, parameters) < 1e-6


def test_a_replayed_piece_is_recognised_and_a_fresh_one_is_not():
    memory = ReplayMemory(total_size=100_000)
    stale = torch.randn(30_000)
    memory.remember("rogue", memory.sample(stale, offset=1_000))
    memory.remember("honest", memory.sample(torch.randn(30_000), offset=1_000))
    # next round: another range of the same flat vector overlaps the one seen before
    replayed = torch.cat([stale, torch.randn(10_000)])[5_000:35_000]
    assert memory.is_replay("rogue", memory.sample(replayed, offset=6_000))
    assert not memory.is_replay("honest", memory.sample(torch.randn(30_000), offset=6_000))
    # too little overlap to judge: not a replay
    assert len(memory.sample(stale[:100], offset=1_000)) < MIN_REPLAY_EVIDENCE
    assert not memory.is_replay("rogue", memory.sample(stale[:100], offset=1_000))
    # zeros repeat in honest updates (parameters nobody used): never evidence
    memory.remember("quiet", memory.sample(torch.zeros(30_000), offset=0))
    assert not memory.is_replay("quiet", memory.sample(torch.zeros(30_000), offset=0))
