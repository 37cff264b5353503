"""A pace for hivemind's search for averaging leaders, which otherwise asks the DHT as fast as it answers.

While an averager looks for a group and no leader is declared yet (the other
peers are still training, or are clients, or are paused), hivemind 1.1's
``PotentialLeaders`` fetches the group key from the DHT, finds nothing, is
asked to fetch again at once (``pop_next_leader`` triggers an update whenever
its queue is empty), and so on: a tight loop of DHT lookups for as long as the
search lasts. In the network lab one peer waiting for slower ones sent ~19 KB/s
of matchmaking traffic this way, and paused swarms flooded at hundreds of
packets a second (``/work/shared/NETWORK-FINDINGS.md``).

``pace_leader_search`` installs the same loop with at least
``MIN_FETCH_INTERVAL_S`` between two fetches. A declared leader is still found
within that interval, far inside a matchmaking window (3 s on a LAN, 15 s over
the internet).
"""

from __future__ import annotations

import asyncio
import math

MIN_FETCH_INTERVAL_S = 1.0


async def _paced_update_queue_periodically(self, key_manager) -> None:
    """hivemind 1.1.12's ``PotentialLeaders._update_queue_periodically`` with a minimum interval between fetches."""
    from hivemind.averaging.matchmaking import MAX_DHT_TIME_DISCREPANCY_SECONDS
    from hivemind.utils import get_dht_time

    loop = asyncio.get_event_loop()
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
        await asyncio.sleep(max(0.0, fetched_at + MIN_FETCH_INTERVAL_S - loop.time()))


def pace_leader_search() -> None:
    """Install the paced search in this process (and the averager processes forked from it); idempotent."""
    from hivemind.averaging.matchmaking import PotentialLeaders

    PotentialLeaders._update_queue_periodically = _paced_update_queue_periodically
