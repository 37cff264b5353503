"""The scale lab's churn schedule (``benchmarks/churn.py``): volunteers' sessions and absences."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from churn import RETURNS, schedule  # noqa: E402

PEERS = ["h1", "h2", "h3"]


def test_each_peer_leaves_first_then_alternates_with_the_matching_return_inside_the_window():
    moves = schedule(PEERS, window_s=3_600, session_s=120, away_s=30, pause_share=0.3, seed=7)
    assert moves == sorted(moves, key=lambda move: move.at)
    assert all(0 <= move.at < 3_600 for move in moves)
    for peer in PEERS:
        own = [move.action for move in moves if move.peer == peer]
        assert len(own) > 10, f"{peer} moved {len(own)} times in an hour of 2.5-minute cycles"
        departures, returns = own[0::2], own[1::2]
        assert set(departures) <= set(RETURNS)
        assert returns == [RETURNS[going] for going in departures[:len(returns)]]


def test_the_schedule_is_the_seeds():
    same = schedule(PEERS, 600, 60, 20, 0.25, seed=3)
    assert same == schedule(PEERS, 600, 60, 20, 0.25, seed=3)
    assert same != schedule(PEERS, 600, 60, 20, 0.25, seed=4)


def test_sessions_and_absences_have_the_asked_means_and_pauses_their_share():
    moves = schedule(["h1"], window_s=2_000_000, session_s=100, away_s=25, pause_share=0.25, seed=1)
    times = [0.0] + [move.at for move in moves]
    sessions = [later - earlier for earlier, later in zip(times[0::2], times[1::2])]
    absences = [later - earlier for earlier, later in zip(times[1::2], times[2::2])]
    assert statistics.fmean(sessions) == pytest.approx(100, rel=0.05)
    assert statistics.fmean(absences) == pytest.approx(25, rel=0.05)
    departures = [move.action for move in moves if move.action in RETURNS]
    assert departures.count("pause") / len(departures) == pytest.approx(0.25, abs=0.02)


def test_no_churn_without_time_for_it():
    assert schedule(PEERS, window_s=0, session_s=60, away_s=20, pause_share=0.5, seed=1) == []
