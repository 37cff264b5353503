"""Progress records in shards in a swarm of twelve (issue 25, ``progress_shards``): light peers in the network lab.

Every read of hivemind's progress key carries all N peers' records, and the
key's few holders answer all N peers' reads: the scale model's worst grower
(11 MB/s at the worst holder of 1,000 peers). Here twelve light peers
(``tracker_peer.py``: a real ``QuietProgressTracker`` each, training nothing;
seven with global addresses, five behind their own NAT router, whose DHT
serves nobody) hold shards to 3 records (``--shard-records``; the default is
32, so that twelve peers are a swarm of a few hundred). They must settle in
one layout of 4 shards, every peer counting all twelve, and end epochs at the
swarm's pace (12 peers x 4 samples a second toward 480: one every 10 s),
not at one shard's; and a read carries its shard's records, not all
twelve as on hivemind's one key, and at most 2 summaries a shard. (At this
size a read of records and summaries is about as large as one of every
record: the saving grows with the swarm, N / S + 2 S entries against N; the
scale model counts it at 100 and 1,000 peers.)
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from light_swarm import LightSwarm, epoch_moves
from shard_keys import spread_identities

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(600)]

PEER = Path(__file__).with_name("tracker_peer.py")
PUBLIC, HOMES = 7, 5
TARGET, BATCH, PERIOD_S = 480, 2, 0.5
SHARD_RECORDS, LIFETIME_S = 3, 20.0
SETTLE_S, WINDOW_S = 60.0, 60.0


def test_twelve_peers_in_shards_of_three_end_epochs_at_the_swarms_pace_reading_a_part_of_it(lab_machine):
    with LightSwarm("shards", PEER) as swarm:
        lab, root = swarm.lab, swarm.root
        hosts = [lab.add_public(f"p{index}") for index in range(PUBLIC)] + \
            [lab.add_home(f"h{index}") for index in range(1, HOMES + 1)]
        arguments = ("--target", str(TARGET), "--batch", str(BATCH), "--period", str(PERIOD_S),
                     "--shard-records", str(SHARD_RECORDS), "--lifetime-s", str(LIFETIME_S))

        def start(host, peers: list[str]) -> None:
            swarm.start(host, peers, *arguments, "--epochs", str(root / f"{host.name}.epochs"))

        # at most 4 peers to a shard (random keys put 7 of 12 in one a time in twenty)
        spread_identities([root / f"{host.name}.key" for host in hosts], 4, most=4)
        swarm.start_all(hosts, start)
        time.sleep(SETTLE_S)  # every peer has met the others, and moved to the layout their number calls for
        since = time.time()
        time.sleep(WINDOW_S)
        until = time.time()
        swarm.finish()

        moves = {host.name: epoch_moves(root / f"{host.name}.epochs", since, until) for host in hosts}
        layouts = {name: sorted({move["shards"] for move in peer}) for name, peer in moves.items()}
        counted = {name: sorted(move["peers"] for move in peer) for name, peer in moves.items()}
        reads = {name: [move["read"] for move in peer] for name, peer in moves.items()}
        honest_epochs = WINDOW_S * len(hosts) * BATCH / PERIOD_S / TARGET
        print(f"layouts {layouts}; peers counted at each move {counted}; epochs in {WINDOW_S:.0f} s "
              f"{ {name: len(peer) for name, peer in moves.items()} } (the swarm's pace: {honest_epochs:.0f}); "
              f"records and summaries read {reads}")
        # one layout, 12 peers in 4 shards of 3, and every peer counted all twelve at most of its epoch moves, and
        # at every one all but a shard's at most (a summary a moment late)
        assert all(layout == [4] for layout in layouts.values()), layouts
        assert all(peer and peer[len(peer) // 2] == len(hosts) and peer[0] >= len(hosts) - SHARD_RECORDS
                   for peer in counted.values()), counted
        # epochs at the swarm's pace, not one shard's (a quarter of it)
        assert all(0.6 * honest_epochs <= len(peer) <= 1.5 * honest_epochs + 2 for peer in moves.values()), \
            {name: len(peer) for name, peer in moves.items()}
        # a read carried its shard's records (at most 4: the identities above), not all twelve as hivemind's key
        # did, and the summaries of the shards' summarizers: 2 a shard, and for a moment a third (a peer that
        # took its record for the lowest while the lowest's was not read yet, until it reads it)
        assert max(records for peer in reads.values() for records, _ in peer) <= 4, reads
        summaries = sorted(summaries for peer in reads.values() for _, summaries in peer if summaries is not None)
        assert summaries and summaries[len(summaries) // 2] <= 2 * 4 and summaries[-1] <= 3 * 4, reads
