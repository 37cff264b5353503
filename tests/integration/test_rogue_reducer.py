"""A rogue reduces a part of every round it joins: what it returns is not used once it is named.

Three hivemind averagers on 127.0.0.1 (real DHTs, real averagers, in this
process): two honest ``PseudoGradientAverager``s and a rogue, a stock hivemind
averager under the same class name, that sends a constant above what its
weight allows (``robust_reduce``'s per-sender bound) and reduces its part with
hivemind's plain weighted mean, its own constant included. The constant is
chosen so that the rogue's mean stays *within* the bound of the group's
largest weight: only knowing that the rogue was named as a sender in the same
round refuses its result, and that is known only because each honest peer
holds the results of other reducers until its own reducer has seen every
piece (``robust_allreduce.CheckedPartContainer``).
"""

from __future__ import annotations

import time

import pytest
import torch
from hivemind.averaging import DecentralizedAverager

from p2ptrain.peers.training.diloco import PseudoGradientAverager
from p2ptrain.peers.robust.reduce import IMPLAUSIBLE, PLAUSIBLE_STEP, REPLAYED, RobustOptions
from test_state_download_check import start_dhts

pytestmark = [pytest.mark.swarm]

SHAPES = [(96, 64), (64,)]
INNER_LR = 1e-3
WEIGHT = 32.0
BOUND = PLAUSIBLE_STEP * INNER_LR * WEIGHT  # of a piece of weight 32, and of a result in a group where 32 is the largest weight
ROGUE_VALUE = 2 * BOUND  # its piece is twice its bound; its plain mean among three equal weights, 2/3 of the bound
PREFIX = "reducer_diloco"
AVERAGING = dict(prefix=PREFIX, min_matchmaking_time=2.0, request_timeout=1.0, part_size_bytes=4096, target_group_size=3, start=True)


def honest_averager(dht, tensors: list[torch.Tensor]) -> PseudoGradientAverager:
    return PseudoGradientAverager(
        state_provider=lambda: ({"epoch": 0}, [tensor.clone() for tensor in tensors]), averaged_tensors=tensors, dht=dht,
        robust=RobustOptions.for_pseudo_gradients(max_weight=1e6, inner_lr=INNER_LR, rounds_held=1.0, parameter_count=len(SHAPES)),
        **AVERAGING,
    )


def outcome(future) -> dict | None:
    """The group a step averaged with (hivemind's gathered data by peer), or None if it found none."""
    try:
        return future.result(timeout=60)
    except Exception:
        return None


def flat(averager) -> torch.Tensor:
    with averager.get_tensors() as tensors:
        return torch.cat([tensor.reshape(-1) for tensor in tensors]).clone()


@pytest.mark.timeout(180)
def test_a_named_rogues_plain_mean_of_its_part_is_not_used():
    torch.manual_seed(0)
    dhts = start_dhts(3)
    averagers = []
    try:
        averagers = [honest_averager(dht, [torch.zeros(shape) for shape in SHAPES]) for dht in dhts[:2]]
        rogue_class = type(PseudoGradientAverager.__name__, (DecentralizedAverager,), {})
        rogue = rogue_class(averaged_tensors=[torch.full(shape, ROGUE_VALUE) for shape in SHAPES], dht=dhts[2], **AVERAGING)
        averagers.append(rogue)
        rogue_id = rogue.peer_id.to_base58()
        for attempt in range(3):
            # fresh honest pieces each attempt: a piece sent again bit for bit is a replay
            pieces = [[INNER_LR * torch.randn(shape) for shape in SHAPES] for _ in range(2)]
            for averager, piece in zip(averagers, pieces):
                with averager.get_tensors() as tensors:
                    for tensor, value in zip(tensors, piece):
                        tensor.copy_(value)
            with rogue.get_tensors() as tensors:
                for tensor in tensors:
                    tensor.fill_(ROGUE_VALUE)
            futures = [averager.step(weight=WEIGHT, wait=False, timeout=20) for averager in averagers]
            groups = [outcome(future) for future in futures]
            if all(group is not None and len(group) == 3 for group in groups):
                break
            time.sleep(1.0)
        else:
            raise AssertionError(f"the three averagers formed no group of three in 3 attempts: {groups}")

        own = [torch.cat([tensor.reshape(-1) for tensor in piece]) for piece in pieces]
        honest_mean = (own[0] + own[1]) / 2
        # what the rogue returned for its part (and kept): hivemind's plain mean, a third of its constant,
        # within the bound of the group's largest weight
        rogues_part = (flat(rogue) - ROGUE_VALUE / 3).abs() < 0.1 * ROGUE_VALUE
        assert float(rogues_part.float().mean()) > 0.15 and float(flat(rogue).abs().max()) < BOUND
        for index in range(2):
            result = flat(averagers[index])
            # parts honest peers reduced: the rogue's piece left out; the rogue's part: our own piece kept
            from_honest = torch.isclose(result, honest_mean, rtol=1e-5, atol=1e-9)
            kept = torch.isclose(result, own[index], rtol=1e-5, atol=1e-9) & ~from_honest
            assert bool((from_honest | kept).all()), f"peer {index} used something else: largest value {float(result.abs().max()):.4f}"
            share_kept = float(kept.float().mean())
            assert 0.15 < share_kept < 0.5, f"peer {index} kept its own piece for {share_kept:.0%} of the values"
            # and says so: the round's averaged share leaves the refused part out
            assert averagers[index].received_share() == pytest.approx(1 - share_kept, abs=0.01)
            named = [(suspect["reason"], suspect["role"]) for report in averagers[index].pop_round_reports()
                     for suspect in report["suspects"] if suspect["peer_id"] == rogue_id]
            # (an attempt that grouped the rogue with one honest peer leaves a replay on the next)
            assert {(IMPLAUSIBLE, "sender"), (REPLAYED, "sender")} & set(named), f"peer {index} named the rogue for {named}"
    finally:
        for averager in averagers:
            averager.shutdown()
        for dht in dhts:
            dht.shutdown()
