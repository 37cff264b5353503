"""The training loop's duty cycle (``policy.max_compute_share``): how long it rests after a step."""

from __future__ import annotations

import pytest

from p2ptrain.peers.worker.duty_cycle import DutyCycle


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("share, rest", [(1.0, 0.0), (0.5, 2.0), (0.25, 6.0), (0.1, 18.0)])
def test_the_rest_after_a_step_holds_computing_to_the_share(share, rest):
    clock = Clock()
    duty = DutyCycle(share, clock)
    assert duty.computed(2.0) == pytest.approx(rest)
    assert 2.0 / (2.0 + rest) == pytest.approx(share)
    assert duty.rest_left_s() == pytest.approx(rest)


def test_the_rest_counts_down_and_the_first_step_computes_at_once():
    clock = Clock()
    duty = DutyCycle(0.5, clock)
    assert duty.rest_left_s() == 0.0
    duty.computed(1.0)
    clock.now += 0.4
    assert duty.rest_left_s() == pytest.approx(0.6)
    clock.now += 1.0
    assert duty.rest_left_s() == 0.0


@pytest.mark.parametrize("share", [0.0, -0.5, 1.5])
def test_a_share_outside_zero_to_one_is_refused(share):
    with pytest.raises(ValueError, match="compute share"):
        DutyCycle(share)
