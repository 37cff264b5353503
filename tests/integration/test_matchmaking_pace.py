"""A peer that looks for an averaging group nobody leads asks the DHT at a pace, not in a tight loop."""

from __future__ import annotations

import multiprocessing
import time

import pytest
import torch

from p2ptrain.peers.net.dht import start_dht, visible_addresses
from p2ptrain.peers.robust.matchmaking import fetch_interval, install_matchmaking

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(120)]
LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


def test_the_pause_between_fetches_grows_with_the_matchmaking_window():
    assert fetch_interval(3.0) == 1.0  # a LAN's window
    assert fetch_interval(10.5) == 1.5
    assert fetch_interval(15.0) == 2.0  # the internet's
    assert fetch_interval(60.0) == 2.0


@pytest.mark.parametrize("matchmaking_time", [2.0, 15.0])
def test_a_search_without_leaders_fetches_at_its_pace(tmp_path, matchmaking_time):
    from hivemind.averaging import DecentralizedAverager
    from hivemind.averaging.key_manager import GroupKeyManager

    search_s = max(8.0, matchmaking_time + 1)  # hivemind refuses a timeout below the window
    install_matchmaking()
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
                                     min_matchmaking_time=matchmaking_time, request_timeout=1.0, start=True)
    try:
        started = time.monotonic()
        assert averager.step(timeout=search_s, allow_retries=False) is None
        elapsed = time.monotonic() - started
    except Exception:
        elapsed = time.monotonic() - started
    finally:
        GroupKeyManager.get_averagers = original
        averager.shutdown()
        second.shutdown()
        first.shutdown()
    assert elapsed >= search_s - 1
    # unpaced, hivemind fetched as fast as the DHT answered: hundreds of times in these seconds
    assert 2 <= fetches.value <= elapsed / fetch_interval(matchmaking_time) + 2
