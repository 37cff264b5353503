"""A pace for hivemind's search for averaging leaders, which otherwise asks the DHT as fast as it answers.

While an averager looks for a group and no leader is declared yet (the other
peers are still training, or are clients, or are paused), hivemind 1.1's
``PotentialLeaders`` fetches the group key from the DHT, finds nothing, is
asked to fetch again at once (``pop_next_leader`` triggers an update whenever
its queue is empty), and so on: a tight loop of DHT lookups for as long as the
search lasts. In the network lab one peer waiting for slower ones sent ~19 KB/s
of matchmaking traffic this way, and paused swarms flooded at hundreds of
packets a second (``docs/findings/network.md``).

``pace_leader_search`` installs the same loop with a pause between two
fetches: a seventh of the matchmaking window, between ``MIN_FETCH_INTERVAL_S``
and ``MAX_FETCH_INTERVAL_S`` (1 s on a LAN's 3 s window, 2 s in the internet's
15 s). A declared leader is still found within that pause, far inside the
window. The peer everyone can dial leads most groups and searches the longest:
in the network lab its matchmaking was 6-8 KB/s at 1 s between fetches.
"""

from __future__ import annotations

import asyncio
import math

MIN_FETCH_INTERVAL_S = 1.0
MAX_FETCH_INTERVAL_S = 2.0


def fetch_interval(matchmaking_time: float) -> float:
    """Seconds between two fetches of the group key in a search with this matchmaking window."""
    return min(MAX_FETCH_INTERVAL_S, max(MIN_FETCH_INTERVAL_S, matchmaking_time / 7))


async def _paced_update_queue_periodically(self, key_manager) -> None:
    """hivemind 1.1.12's ``PotentialLeaders._update_queue_periodically`` with a pause between fetches (``fetch_interval``)."""
    from hivemind.averaging.matchmaking import MAX_DHT_TIME_DISCREPANCY_SECONDS
    from hivemind.utils import get_dht_time

    loop = asyncio.get_event_loop()
    interval = fetch_interval(self.min_matchmaking_time)
    while get_dht_time() < self.search_end_time:
        fetched_at = loop.time()
        new_peers = await key_manager.get_averagers(key_manager.current_key, only_active=True)
        self.max_assured_time = max(
            self.max_assured_time, get_dht_time() + self.min_matchmaking_time - MAX_DHT_TIME_DISCREPANCY_SECONDS
        )
        self.leader_queue.clear()
        for peer, peer_expiration_time in new_peers:
            if peer == self.peer_id or (peer, peer_expiration_time) in self.past_attempts:
                continue
            self.leader_queue.store(peer, peer_expiration_time, peer_expiration_time)
            self.max_assured_time = max(self.max_assured_time, peer_expiration_time - MAX_DHT_TIME_DISCREPANCY_SECONDS)
        self.update_finished.set()

        await asyncio.wait(
            {asyncio.create_task(self.running.wait()), asyncio.create_task(self.update_triggered.wait())},
            return_when=asyncio.ALL_COMPLETED,
            timeout=self.search_end_time - get_dht_time() if math.isfinite(self.search_end_time) else None,
        )
        self.update_triggered.clear()
        await asyncio.sleep(max(0.0, fetched_at + interval - loop.time()))


def pace_leader_search() -> None:
    """Install the paced search in this process (and the averager processes forked from it); idempotent."""
    from hivemind.averaging.matchmaking import PotentialLeaders

    PotentialLeaders._update_queue_periodically = _paced_update_queue_periodically
