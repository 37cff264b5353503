"""Progress records in shards, and the shards' summaries (``progress_shards``): real DHT peers on 127.0.0.1.

Every read of hivemind's progress key carries every peer's record: past a
few dozen peers that is most of a peer's background, and the key's holders
answer all N peers' reads (the scale model, issue 25). Here eight peers whose
trackers hold shards to 2 records (``shard_records``; the default is 32) must
spread their records over 4 keys, none holding them all, and still each see
all eight peers and the swarm's samples (not their own shard's), as the
swarm view does; the metrics records go to the same shards.
"""

from __future__ import annotations

import time

import pytest
from hivemind.utils import get_dht_time

from metered_peers import loopback_dhts
from p2ptrain.peers.net.dht import signing_key
from p2ptrain.peers.swarm.records import LocalMetrics, metrics_key
from p2ptrain.peers.swarm.run_records import publish_metrics
from p2ptrain.peers.swarm.view import read_swarm
from p2ptrain.peers.swarm import progress_shards
from p2ptrain.peers.training.progress import QuietProgressTracker
from shard_keys import spread_identities

pytestmark = pytest.mark.swarm

PEERS, SHARD_RECORDS = 8, 2
LIFETIME_S = 20.0  # the records' lifetime, and how long a peer that moved to another layout stays


def wait_for(condition, timeout: float, what: str, state) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {state()}"
        time.sleep(0.5)


def records_under(dht, key: str) -> int:
    """How many peers' records the DHT holds under ``key`` (emptied ones, a peer's goodbye, not counted)."""
    found = dht.get(key, latest=True)
    if found is None or not isinstance(found.value, dict):
        return 0
    return sum(1 for entry in found.value.values() if isinstance(entry.value, dict))


@pytest.mark.timeout(240)
def test_eight_peers_in_shards_of_two_each_see_every_peer_and_the_swarms_samples(tmp_path):
    trackers = []
    spread_identities([tmp_path / f"peer{index}.key" for index in range(PEERS)], 4, most=4)
    with loopback_dhts(tmp_path, PEERS) as dhts:
        try:
            trackers += [QuietProgressTracker(dht, prefix="shards", target_batch_size=10 ** 6, start=True,
                                              private_key=signing_key(dht), shard_records=SHARD_RECORDS,
                                              metadata_expiration=LIFETIME_S, min_refresh_period=1.0,
                                              max_refresh_period=2.0) for dht in dhts]

            def state():
                return [(tracker.shards, tracker.global_progress.num_peers, tracker.global_progress.samples_accumulated)
                        for tracker in trackers]

            started = time.monotonic()
            for second in range(1, 1000):
                for tracker in trackers:
                    tracker.report_local_progress(0, 4 * second)
                if {tracker.shards for tracker in trackers} == {4} and \
                        all(tracker.global_progress.num_peers == PEERS for tracker in trackers):
                    break
                assert time.monotonic() - started < 150, f"no common layout of 4 shards, every peer seen: {state()}"
                time.sleep(1.0)
            # every reader counts the swarm's samples (8 peers x 4 a second) from its shard's records and the others'
            # summaries: its own shard alone holds at most 4 of the 8 peers (below)
            samples, reported_at = PEERS * 4 * second, time.monotonic()
            assert all(0.7 * samples <= progress[2] <= samples for progress in state()), (samples, state())

            # a peer reads its shard every 1-2 s here, and the summaries at most every sixth of a record's
            # lifetime (3.3 s): some reads carry them (a number), the others only the shard (None)
            seen = [set() for _ in trackers]
            for _ in range(24):
                for found, tracker in zip(seen, trackers):
                    found.add(tracker.last_read_entries[1] is None)
                time.sleep(0.5)
            assert all(found == {True, False} for found in seen), seen

            # the records are spread over the shards' keys: each peer's in one, no key holds them all, none is left
            # in hivemind's own key
            keys = [progress_shards.shard_key("shards_progress", 4, index) for index in range(4)]
            held = [records_under(dhts[0], key) for key in keys]
            assert sum(held) == PEERS and max(held) <= 4, held
            assert records_under(dhts[0], "shards_progress") == 0

            # each peer's metrics record goes to its shard too, and the swarm view counts the summaries: a training
            # peer's lists its shard's peers (the dashboard's table), an observer's every peer (the monitor's)
            for dht, tracker in zip(dhts, trackers):
                assert publish_metrics(dht, "shards", LocalMetrics(peer_id=dht.peer_id.to_base58(), manifest_hash="manifest",
                                                                   time=get_dht_time()), place=tracker.place())
            held = [records_under(dhts[0], metrics_key("shards", 4, index)) for index in range(4)]
            assert sum(held) == PEERS and max(held) <= 4 and records_under(dhts[0], "shards_metrics") == 0, held
            for dht, tracker in zip(dhts, trackers):
                views = []  # a summary read a moment before a record reached its summarizer counts one peer fewer

                def view_counts_every_peer(dht=dht, tracker=tracker, views=views):
                    views.append(read_swarm(dht, "shards", "manifest", 10 ** 6, progress_prefix="shards", place=tracker.place()))
                    return views[-1].num_peers == PEERS

                wait_for(view_counts_every_peer, 30, "the view to count every peer", lambda views=views: views[-1])
                # (the records' samples extrapolated at 4 a second a peer since they were reported)
                most = PEERS * 4 * (second + time.monotonic() - reported_at + 1)
                assert 0.5 * samples <= views[-1].samples_accumulated <= most, (views[-1], most)
                assert len(views[-1].peers) == held[tracker.place()[1]], (views[-1].peers, held)
            observer = read_swarm(dhts[0], "shards", "manifest", 10 ** 6, progress_prefix="shards")
            assert len(observer.peers) == PEERS and observer.num_peers == PEERS, observer

        finally:
            for tracker in trackers:
                tracker.shutdown()
