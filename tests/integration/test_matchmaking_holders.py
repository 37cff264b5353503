"""Averaging groups found by reading the group key from its holders (``install_matchmaking``):
eight real hivemind averagers on 127.0.0.1, their DHT requests logged
(``benchmarks/matchmaking_requests.py`` measures; the benchmark runs hivemind's path beside it).

hivemind's ``GroupKeyManager`` read the group key with a search that asks every node
among the 20 nearest (7 requests a fetch at 8 peers) and searched before each
declaration; the scale model projects that as the largest part of a peer's
background past about 84 peers (issue 25). Installed, a fetch reads this peer's
own copy or one holder, and a declaration goes straight to the holders.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import matchmaking_requests  # noqa: E402

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(240)]


def test_eight_averagers_find_one_group_with_a_request_a_fetch_at_most(tmp_path):
    found = matchmaking_requests.measure(tmp_path, peers=8, clients=2, path="holders")
    print(found)
    assert found["group_sizes"] == [8] * 8 and all(found["averaged_right"])
    assert found["fetches"] >= 8 and found["declarations"] >= 6
    assert found["kinds"] == ["matchmaking"]  # the meter's kind for them
    # hivemind's search asked all 7 other nodes at each fetch, and searched before each declaration
    assert found["requests"]["rpc_find"] <= found["fetches"], found
    assert found["requests"]["rpc_store"] <= 5 * found["declarations"]
    assert set(found["reads"]) <= {"local", "holders"}, found["reads"]  # never hivemind's search
    assert found["reads"].get("local", 0) >= found["fetches"] // 4  # the key's holders read their own copy


def test_a_holder_that_hides_every_leader_splits_no_group(tmp_path):
    # the holder nearest to the group key answers every fetch with nothing; the others hold every declaration
    found = matchmaking_requests.measure(tmp_path, peers=8, clients=2, path="holders", hiding=1)
    print(found)
    assert found["group_sizes"] == [8] * 8 and all(found["averaged_right"])
    assert set(found["reads"]) <= {"local", "holders"}, found["reads"]
