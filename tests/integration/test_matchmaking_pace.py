"""A peer that looks for an averaging group nobody leads asks the DHT at a pace, not in a tight loop."""

from __future__ import annotations

import multiprocessing
import time

import pytest
import torch

from p2ptrain.peers.dht import start_dht, visible_addresses
from p2ptrain.peers.matchmaking import MIN_FETCH_INTERVAL_S, pace_leader_search

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(120)]
LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
SEARCH_S = 8.0


def test_a_search_without_leaders_fetches_about_once_a_second(tmp_path):
    from hivemind.averaging import DecentralizedAverager
    from hivemind.averaging.key_manager import GroupKeyManager

    pace_leader_search()
    fetches = multiprocessing.Value("i", 0)
    original = GroupKeyManager.get_averagers

    async def counted(self, *args, **kwargs):  # runs in the averager process, forked below
        with fetches.get_lock():
            fetches.value += 1
        return await original(self, *args, **kwargs)

    GroupKeyManager.get_averagers = counted
    first = start_dht([], tmp_path / "a.key", host_maddrs=LOOPBACK, start_timeout=30)
    second = start_dht(visible_addresses(first), tmp_path / "b.key", host_maddrs=LOOPBACK, start_timeout=30)
    # a client never leads: with no other averager in the run, it searches until its timeout
    averager = DecentralizedAverager([torch.zeros(4)], second, prefix="lonely", client_mode=True,
                                     min_matchmaking_time=2.0, request_timeout=1.0, start=True)
    try:
        started = time.monotonic()
        assert averager.step(timeout=SEARCH_S, allow_retries=False) is None
        elapsed = time.monotonic() - started
    except Exception:
        elapsed = time.monotonic() - started
    finally:
        GroupKeyManager.get_averagers = original
        averager.shutdown()
        second.shutdown()
        first.shutdown()
    assert elapsed >= SEARCH_S - 1
    # unpaced, hivemind fetched as fast as the DHT answered: hundreds of times in these seconds
    assert 2 <= fetches.value <= elapsed / MIN_FETCH_INTERVAL_S + 2
