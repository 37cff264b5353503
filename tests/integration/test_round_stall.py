"""A group member that freezes mid-round is left out after a deadline set by the peers' recent rounds.

Eight real DiLoCo averagers, configured as a worker's on the internet but with a
60-s round timeout, average three rounds together; in the fourth one member's
averager process is stopped once its group formed (``stalled_round``). Before
the deadlines from recent rounds (``RobustAverager._stall_deadlines``), DiLoCo's
averager had no deadline per member: the seven others waited the 60 s for it
and the round failed for all of them (``MatchmakingException: Unable to run
All-Reduce``). Now they leave it out after ``MIN_STALL_S`` and average without it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stalled_round import stalled_round  # noqa: E402

from p2ptrain.peers.robust.averager import MIN_STALL_S  # noqa: E402

pytestmark = [pytest.mark.swarm]

PEERS, ROUND_TIMEOUT_S = 8, 60.0


@pytest.mark.timeout(300)
def test_a_member_that_freezes_mid_round_is_left_out_and_the_others_average():
    measured = stalled_round(PEERS, ROUND_TIMEOUT_S)
    print(f"\n{measured}")
    assert measured["averaged"] == PEERS - 1, measured
    assert measured["deadlines"] == [MIN_STALL_S] * (PEERS - 1), f"rounds here take well under 3 s: {measured}"
    # the stopped member's own part of the reduction is given up after twice the deadline at most
    assert measured["seconds"] < 2 * MIN_STALL_S + 10 < ROUND_TIMEOUT_S, measured
    # where the stopped member reduced nothing, each peer keeps its own value: most are the seven's mean
    assert measured["mean"] > 0.5, measured
