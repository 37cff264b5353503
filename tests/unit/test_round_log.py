"""``benchmarks/round_log.py``: a kept daemon log read back as the lab's returns, groups and record reads."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from round_log import groups_before_steps, joins, record_reads, timed  # noqa: E402

# a daemon's lines and its worker's hivemind lines, interleaved as in a kept log
LOG = """\
2026-11-28 10:15:54,734 INFO p2ptrain.daemon.event_log: joined: joined run 'scale' as 12D3KooWF9
Nov 28 10:15:55.201 [INFO] Pre-scheduling gradient averaging round in 15.00 sec
2026-11-28 10:15:56,000 worker[1] INFO p2ptrain.peers.training.progress: progress records read: aa8s2d e15 16 @33 s 45.1/s client; kwDkSk e16 64 @2 s 3.9/s
Nov 28 10:15:58.000 [DEBUG] [hivemind.averaging.matchmaking.leader_assemble_group:385] x - assembled group of 12 peers
Nov 28 10:16:01.103 [INFO] Beginning optimizer step #17
Nov 28 10:16:13.280 [DEBUG] [hivemind.averaging.matchmaking._request_join_group:203] x - joining the group of y
Nov 28 10:16:28.001 [DEBUG] [hivemind.averaging.matchmaking.follower_assemble_group:402] x - follower assembled group with leader y
2026-11-28 10:16:31,975 worker[1] INFO p2ptrain.peers.training.sync: Averaged with 12 of 13 other peers one epoch ahead: moving to their epoch 19
2026-11-28 10:16:31,976 INFO p2ptrain.daemon.event_log: averaged: averaged with 14 peers
Nov 28 10:16:40.000 [INFO] Beginning optimizer step #19
"""


def test_a_return_whose_first_round_was_the_swarms_next_one(tmp_path):
    log = tmp_path / "h8.log"
    log.write_text(LOG)
    (found,) = joins(timed(log))
    assert found == {"at": "10:15:54", "scheduled": 0.5, "group": 3.3, "step": 6.4, "asked": 18.5, "late": 37.2,
                     "round": 37.2}


def test_groups_formed_before_each_step_and_records_too_fast_or_too_old(tmp_path):
    log = tmp_path / "pub.log"
    log.write_text(LOG)
    lines = timed(log)
    assert groups_before_steps(lines) == [3.1, 12.0]  # the second: the follower's group at 10:16:28
    assert record_reads(lines, fast=20.0, stale=20.0) == {
        "reads": 1, "with one over 20/s": 1, "with one over 20 s old": 1, "fastest": 45.1}
