"""How often a peer stores its progress record: counted with p2ptrain's traffic meter
between two real hivemind DHT peers on 127.0.0.1 (``tests/metered_peers.py``).

Far from the swarm's epoch end a step's progress waits for the next periodic store;
near the end every step is stored (``p2ptrain.peers.progress``).
"""

import time

import pytest

from metered_peers import loopback_dhts, sent_and_received
from p2ptrain.peers.progress import QuietProgressTracker

pytestmark = pytest.mark.swarm
STEPS = 30


@pytest.fixture
def two_peers(tmp_path, meter):
    with loopback_dhts(tmp_path, 2) as peers:
        yield peers


def progress_bytes_of_steps(meter, dht, run: str, near_end_s: float) -> int:
    """Bytes of progress traffic while a tracker reports ``STEPS`` steps of 8 samples (a step every 50 ms)."""
    # a target no swarm reaches soon: the estimated end is far away
    tracker = QuietProgressTracker(dht, prefix=run, target_batch_size=10**9, near_end_s=near_end_s, start=True)
    try:
        time.sleep(1.0)  # its first fetch of the (empty) swarm
        before = sent_and_received(meter, "progress")
        for step in range(1, STEPS + 1):
            tracker.report_local_progress(0, 8 * step)
            time.sleep(0.05)
        time.sleep(1.0)  # the last stores land
        return sent_and_received(meter, "progress") - before
    finally:
        tracker.shutdown()


@pytest.mark.timeout(120)
def test_far_from_the_epoch_end_steps_wait_for_the_periodic_store(two_peers, meter):
    far = progress_bytes_of_steps(meter, two_peers[0], "far-run", near_end_s=0.0)
    near = progress_bytes_of_steps(meter, two_peers[0], "near-run", near_end_s=float("inf"))
    # far: the epoch's first samples are stored and then nothing until report_period (10 s);
    # near: every step (hivemind's pace), each a signed record sent to the other peer
    assert far > 0
    assert near >= 10 * far, (far, near)
