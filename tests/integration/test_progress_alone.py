"""Whether a DiLoCo peer is alone in its swarm, from the progress records (two real DHT peers on 127.0.0.1).

A peer that has just joined sees one progress record, someone else's: it is not
alone (hivemind's ``num_peers`` is 1 there too, which once made three
volunteers take outer steps on their own right after joining, see
``QuietProgressTracker.alone``).
"""

from __future__ import annotations

import time

import pytest

from metered_peers import loopback_dhts
from p2ptrain.peers.net.dht import signing_key
from p2ptrain.peers.training.progress import QuietProgressTracker

pytestmark = pytest.mark.swarm


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.mark.timeout(90)
def test_a_peer_that_sees_only_another_peers_record_is_not_alone(tmp_path):
    trackers = []
    with loopback_dhts(tmp_path, 2) as (first_dht, joiner_dht):
        try:
            # two DHTs in one process: each tracker signs with its own DHT's key (start_dht's docstring)
            first = QuietProgressTracker(first_dht, prefix="alone", target_batch_size=64, start=True,
                                         private_key=signing_key(first_dht))
            trackers.append(first)
            first.report_local_progress(0, 8)
            # its own record, once stored and read back, is no company
            wait_for(lambda: first.global_progress.num_peers == 1, 30, "the first peer to see its own record")
            assert first.alone

            joiner = QuietProgressTracker(joiner_dht, prefix="alone", target_batch_size=64, start=True,
                                          private_key=signing_key(joiner_dht))
            trackers.append(joiner)
            assert joiner.global_progress.num_peers == 1 and not joiner.alone  # one record, not its own
            joiner.report_local_progress(0, 8)
            wait_for(lambda: first.global_progress.num_peers == 2, 30, "the first peer to see the joiner")
            assert not first.alone
        finally:
            for tracker in trackers:
                tracker.shutdown()
