"""A pause does not wait for an averaging round nobody comes to.

The worker runs the daemon's commands between steps, and a step can wait for a round: a
DiLoCo peer of fixed H (``round_end: local_steps``) waits for its outer step's group up to
the averaging timeout (120 s on the internet). Its partner is killed (its progress record
stays, promising a group), and a ``pause`` sent while the step waits for that group waited
the whole timeout (as a leave of the NAT lab's last peer did, 120 s inside its step). Now the
worker reads commands as they come (``command_inbox``) and lets go of the rounds that found
no group at a pause or leave: the step ends as after a round without a group, and the pause
checkpoints and exits at once.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from test_worker_swarm import rounds_with_others, run_manifest, start_swarm, stop_all  # noqa: E402

from p2ptrain.worker_pipe import AveragingTimings  # noqa: E402

pytestmark = pytest.mark.swarm

AVERAGING_TIMEOUT_S = 90.0
MATCHMAKING_S = 3.0


def quiet_for(worker, seconds: float, timeout: float) -> None:
    """Wait until ``worker`` sent no step report for ``seconds``: its steps wait for the swarm (or a round)."""
    deadline = time.monotonic() + timeout
    last_count, last_change = -1, time.monotonic()
    while time.monotonic() < deadline:
        worker.drain(0.2)
        count = len(worker.of_type("step"))
        if count != last_count:
            last_count, last_change = count, time.monotonic()
        elif time.monotonic() - last_change >= seconds:
            return
    raise AssertionError(f"{worker.spec['nickname']} kept training for {timeout:.0f} s: it never waited for a round")


@pytest.mark.timeout(300)
def test_a_pause_does_not_wait_out_a_round_without_a_group(tmp_path):
    manifest = run_manifest("pause-in-round", mode="diloco", round_end="local_steps", local_steps=6, target_batch_size=48)
    workers = start_swarm(tmp_path, manifest, 2,
                          averaging=AveragingTimings(matchmaking_time=MATCHMAKING_S, averaging_timeout=AVERAGING_TIMEOUT_S))
    try:
        stays, goes = workers
        for worker in workers:
            worker.wait_for(lambda w: rounds_with_others(w) >= 1, 150, "a round averaged together")
        goes.kill_group()  # no goodbye: its progress record promises a group until it expires
        # stays finishes its H steps, waits for the swarm's samples (at most 3 matchmaking windows), then
        # for its outer step's group: no step reports past that
        quiet_for(stays, 3 * MATCHMAKING_S + 4, 60)
        stays.send("pause")
        sent = time.monotonic()
        stays.wait_for(lambda w: any(r["state"] == "paused" for r in w.of_type("state")), AVERAGING_TIMEOUT_S + 30, "the pause")
        took = time.monotonic() - sent
        assert took < 30, f"the pause waited {took:.0f} s for a round nobody came to (averaging timeout {AVERAGING_TIMEOUT_S:.0f} s)"
        assert [event["data"]["reason"] for event in stays.events("averaging-failed")][-1:] == ["no-group"], \
            "the round let go of counts as one without a group"
        assert stays.events("checkpoint-saved")[-1]["data"]["reason"] == "pause"
    finally:
        stop_all(workers)
