"""hivemind's search for averaging leaders, paced and read from the group key's holders.

While an averager looks for a group and no leader is declared yet (the other
peers are still training, or are clients, or are paused), hivemind 1.1's
``PotentialLeaders`` fetches the group key from the DHT, finds nothing, is
asked to fetch again at once (``pop_next_leader`` triggers an update whenever
its queue is empty), and so on: a tight loop of DHT lookups for as long as the
search lasts. In the network lab one peer waiting for slower ones sent ~19 KB/s
of matchmaking traffic this way, and paused swarms flooded at hundreds of
packets a second (``docs/findings/network.md``).

The paced search is the same loop with a pause between two
fetches: a seventh of the matchmaking window, between ``MIN_FETCH_INTERVAL_S``
and ``MAX_FETCH_INTERVAL_S`` (1 s on a LAN's 3 s window, 2 s in the internet's
15 s). A declared leader is still found within that pause, far inside the
window. The peer everyone can dial leads most groups and searches the longest:
in the network lab its matchmaking was 6-8 KB/s at 1 s between fetches.

Each fetch was also a whole search: hivemind's ``GroupKeyManager`` reads the
group key with ``dht.get(key, latest=True)``, which asks every node among the
20 nearest to the key, and declares a leader with ``dht.store``, which first
searches for the key's holders with requests whose answers carry the key's
value. So a fetch cost min(N - 1, 20) requests, the scale model's largest part
of a peer's background past about 84 peers (24.5 KB/s a peer, issue 25).
``HolderReadGroupKeys`` reads and declares through ``local_reads`` instead, as
the progress and metrics records are: from this peer's own copy where it holds
every declaration, else from one of the key's holders, the answers merged with
the earlier ones; declarations go straight to the holders. A key nobody leads
is often empty, so an empty answer is not followed by a search of the swarm
(a search would find the same: every declaration is stored to the holders).

``install_matchmaking`` installs both in this process and the averager
processes it forks afterwards.
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


def _holder_read_group_keys():
    """``HolderReadGroupKeys``, defined on first use: hivemind is imported only by the processes that train."""
    from hivemind.averaging.key_manager import GroupKeyManager

    from p2ptrain.peers.net.local_reads import LocalFirstDHT

    class HolderReadGroupKeys(GroupKeyManager):
        """hivemind's ``GroupKeyManager`` whose reads and declarations of group keys go through
        ``local_reads`` (see the module docstring); every argument is ``GroupKeyManager``'s."""

        def __init__(self, dht, *args, **kwargs):
            super().__init__(dht, *args, **kwargs)
            self.dht = LocalFirstDHT(dht, search=False)

    return HolderReadGroupKeys


def install_matchmaking() -> None:
    """Install the paced search and the holder reads of group keys in this process (and the averager
    processes forked from it); idempotent."""
    from hivemind.averaging import matchmaking
    from hivemind.averaging.key_manager import GroupKeyManager

    matchmaking.PotentialLeaders._update_queue_periodically = _paced_update_queue_periodically
    if matchmaking.GroupKeyManager is GroupKeyManager:  # Matchmaking makes its key manager from this name
        matchmaking.GroupKeyManager = _holder_read_group_keys()
