"""The scale lab's churn (``benchmarks/churn.py``): volunteers' sessions and absences, and how a return is timed."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import subprocess  # noqa: E402

from churn import RETURNS, Churn, Move, schedule  # noqa: E402

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


def test_newcomers_join_once_inside_their_span_and_leave_the_others_schedule_as_it_was():
    without = schedule(PEERS, 600, 60, 20, 0.25, seed=3)
    moves = schedule(PEERS, 600, 60, 20, 0.25, seed=3, newcomers=["h4", "h5"], newcomers_between=(60, 400))
    assert [move for move in moves if move.peer in PEERS] == without
    late = [move for move in moves if move.peer not in PEERS]
    assert sorted(move.peer for move in late) == ["h4", "h5"] and {move.action for move in late} == {"join"}
    assert all(60 <= move.at <= 400 for move in late)


def test_no_churn_without_time_for_it():
    assert schedule(PEERS, window_s=0, session_s=60, away_s=20, pause_share=0.5, seed=1) == []


class Volunteer:
    """A daemon as the churn sees it: its contributed samples, or None while no worker of it trains."""

    def __init__(self):
        self.readings = [None]

    def contributed(self) -> int | None:
        return self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]


def test_a_return_counts_from_the_first_number_its_new_worker_shows_not_from_its_checkpoint():
    """A worker that joins again shows its checkpoint's totals at once: those are not new samples."""
    volunteer = Volunteer()
    volunteer.readings = [300, None, None, 300, 300, 364]  # leave; away; the new worker: its checkpoint, then a round
    churn = Churn({"h1": volunteer}, lambda daemon, *arguments: subprocess.CompletedProcess(arguments, 0, "", ""),
                  ["run"], lambda daemon: daemon.contributed())
    churn.run([Move(0.0, "h1", "leave"), Move(0.05, "h1", "join")], window_s=1.0, every_s=0.01)
    (returned,) = churn.returns
    assert returned["action"] == "join" and returned["seconds"] is not None
    assert volunteer.readings == [364], "the return was counted before the round that used its samples"


def test_a_newcomer_is_not_training_until_its_first_join_contributes_and_that_join_is_marked_first():
    newcomer, seen = Volunteer(), []
    newcomer.readings = [None, None, 0, 0, 64]  # no worker yet; joined: nothing used; a round used 64
    churn = Churn({"h9": newcomer}, lambda daemon, *arguments: subprocess.CompletedProcess(arguments, 0, "", ""),
                  ["run"], lambda daemon: daemon.contributed(), newcomers=frozenset({"h9"}))
    churn.run([Move(0.05, "h9", "join")], window_s=1.0, every_s=0.01, sample=seen.append)
    assert seen[0] == [] and seen[-1] == ["h9"], "the newcomer counted as training before it contributed"
    (joined,) = churn.returns
    assert joined["first"] is True and joined["seconds"] is not None
