"""The divergence guard's rules (``p2ptrain.peers.training.divergence``) on plain numbers."""

from __future__ import annotations

import random

import pytest

from p2ptrain.peers.training.divergence import DivergenceGuard, GuardSettings


def noisy_losses(count: int, level: float = 3.0, noise: float = 0.1, seed: int = 0) -> list[float]:
    generator = random.Random(seed)
    return [level + generator.gauss(0, noise) for _ in range(count)]


def feed(guard: DivergenceGuard, losses) -> list:
    return [divergence for divergence in map(guard.observe, losses) if divergence is not None]


def test_a_noisy_loss_that_falls_never_diverges():
    guard = DivergenceGuard()
    falling = [5.0 - 2.0 * step / 2000 + noise for step, noise in enumerate(noisy_losses(2000, level=0, noise=0.15))]
    assert feed(guard, falling) == []
    assert guard.healthy and guard.lr_scale == 1.0


def test_one_hard_batch_is_not_divergence_but_three_high_steps_are():
    guard = DivergenceGuard()
    feed(guard, noisy_losses(50))
    assert guard.observe(9.0) is None and not guard.healthy  # suspect: no checkpoint from this state
    assert guard.observe(3.0) is None and guard.healthy
    assert guard.observe(9.0) is None and guard.observe(10.0) is None
    divergence = guard.observe(14.0)
    assert divergence is not None and divergence.reason == "loss-spike" and divergence.steps == 3
    assert divergence.level == pytest.approx(3.0, abs=0.1) and divergence.loss == 14.0
    assert divergence.rollbacks == 1 and not divergence.pause and divergence.lr_scale == 0.5
    assert not guard.healthy  # until the worker has rolled back
    guard.restored()
    assert guard.healthy


def test_a_rise_within_the_noise_floor_is_not_a_spike():
    guard = DivergenceGuard()
    feed(guard, [3.0] * 50)  # a flat loss has MAD 0: the rise floor decides
    assert feed(guard, [3.6] * 10) == []
    assert feed(guard, [3.9] * 3)[0].reason == "loss-spike"


def test_no_level_is_judged_before_the_minimum_history():
    guard = DivergenceGuard()
    assert guard.threshold() is None
    assert feed(guard, noisy_losses(17) + [50.0, 60.0, 70.0]) == []


def test_a_run_of_non_finite_batches_diverges_from_the_first_step():
    guard = DivergenceGuard()
    assert feed(guard, [None] * 4 + [3.0] + [None] * 4) == []  # a finite step in between resets the run
    divergence = guard.observe(float("nan"))
    assert divergence is not None and divergence.reason == "non-finite" and divergence.steps == 5 and divergence.level is None


def test_repeated_divergence_pauses_and_calm_restores_the_rate():
    guard = DivergenceGuard(GuardSettings(calm_steps=100))
    feed(guard, noisy_losses(50))
    first = feed(guard, [20.0] * 3)[0]
    guard.restored()
    second = feed(guard, [20.0] * 3)[0]
    guard.restored()
    assert (first.pause, second.pause, second.lr_scale) == (False, False, 0.25)
    feed(guard, noisy_losses(99, seed=1))
    third = feed(guard, [None] * 5)[0]
    assert third.pause and third.rollbacks == 3 and third.lr_scale == 0.125
    # a guard that rolled back once and then trained calmly forgets it
    calm = DivergenceGuard(GuardSettings(calm_steps=100))
    feed(calm, noisy_losses(50))
    feed(calm, [20.0] * 3)
    calm.restored()
    feed(calm, noisy_losses(100, seed=2))
    assert (calm.rollbacks, calm.lr_scale) == (0, 1.0)


def test_the_lowered_rate_survives_a_checkpoint():
    guard = DivergenceGuard()
    feed(guard, noisy_losses(50))
    feed(guard, [20.0] * 3)
    resumed = DivergenceGuard()
    resumed.load_state_dict(guard.state_dict())
    assert resumed.lr_scale == 0.5
    resumed.load_state_dict(None)  # a checkpoint from before the guard
    assert resumed.lr_scale == 0.5


def test_inconsistent_settings_are_refused():
    with pytest.raises(ValueError):
        GuardSettings(window=10, min_history=20)
