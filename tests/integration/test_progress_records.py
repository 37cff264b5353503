"""What a peer's progress tracker reads of the swarm: real DHT peers on 127.0.0.1.

Whether a DiLoCo peer is alone in its swarm, from the progress records; what
a hostile peer's signed record can make the others believe (``progress_checks``).

A peer that has just joined sees one progress record, someone else's: it is not
alone (hivemind's ``num_peers`` is 1 there too, which once made three
volunteers take outer steps on their own right after joining, see
``QuietProgressTracker.alone``).
"""

from __future__ import annotations

import asyncio
import time

import pytest
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.schema import SchemaValidator
from hivemind.optim.progress_tracker import TrainingProgressSchema
from hivemind.utils import get_dht_time

from metered_peers import loopback_dhts
from p2ptrain.peers.net.dht import signing_key
from p2ptrain.peers.training.progress import QuietProgressTracker

pytestmark = pytest.mark.swarm

_call_store = DHTProtocol.call_store


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def tracker_on(dht, prefix: str) -> QuietProgressTracker:
    """A running tracker of the run ``prefix`` on ``dht``, a 64-sample target; two DHTs in one process: each
    tracker signs with its own DHT's key (``start_dht``'s docstring)."""
    return QuietProgressTracker(dht, prefix=prefix, target_batch_size=64, start=True, private_key=signing_key(dht))


@pytest.mark.timeout(90)
def test_a_peer_that_sees_only_another_peers_record_is_not_alone(tmp_path):
    trackers = []
    with loopback_dhts(tmp_path, 2) as (first_dht, joiner_dht):
        try:
            first = tracker_on(first_dht, "alone")
            trackers.append(first)
            first.report_local_progress(0, 8)
            # its own record, once stored and read back, is no company
            wait_for(lambda: first.global_progress.num_peers == 1, 30, "the first peer to see its own record")
            assert first.alone

            joiner = tracker_on(joiner_dht, "alone")
            trackers.append(joiner)
            assert joiner.global_progress.num_peers == 1 and not joiner.alone  # one record, not its own
            joiner.report_local_progress(0, 8)
            wait_for(lambda: first.global_progress.num_peers == 2, 30, "the first peer to see the joiner")
            assert not first.alone
        finally:
            for tracker in trackers:
                tracker.shutdown()


@pytest.mark.timeout(90)
def test_after_an_epoch_update_the_swarm_is_read_at_once_not_at_the_next_scheduled_read(tmp_path):
    """hivemind checks once an epoch, at the first read after the update, that a peer is on the swarm's
    epoch; a read that came only at the next epoch's end made a peer download the state every other round."""
    with loopback_dhts(tmp_path, 1) as (dht,):
        tracker = tracker_on(dht, "prompt")
        try:
            tracker.report_local_progress(0, 8)
            wait_for(tracker.fetched_global_progress_this_epoch.is_set, 30, "the first read")
            tracker.global_progress.next_fetch_time = get_dht_time() + 60  # as when the swarm's end looked far
            tracker.global_state_updated.set()  # the fetcher takes the new time: its next read is a minute away
            time.sleep(1)
            with tracker.pause_updates():
                tracker.update_epoch(1)
                assert not tracker.fetched_global_progress_this_epoch.is_set()
            wait_for(tracker.fetched_global_progress_this_epoch.is_set, 10, "a read of the swarm early in epoch 1")
        finally:
            tracker.shutdown()


def read_now(tracker) -> None:
    """Have ``tracker`` read the swarm's records at once (as after an epoch update)."""
    tracker.fetched_global_progress_this_epoch.clear()
    tracker.global_progress.next_fetch_time = get_dht_time()
    tracker.global_state_updated.set()
    wait_for(tracker.fetched_global_progress_this_epoch.is_set, 10, "a read of the swarm")


async def _slow_call_store(self, *args, **kwargs):
    """``DHTProtocol.call_store`` over a slow link: each store arrives a second late."""
    await asyncio.sleep(1.0)
    return await _call_store(self, *args, **kwargs)


@pytest.mark.timeout(90)
def test_a_peer_that_leaves_takes_its_record_with_it(tmp_path, monkeypatch):
    """A leaving worker shuts its tracker down and then its DHT at once. The tracker's goodbye (its record
    replaced by an empty one) must be stored before: a left peer's record counted in the swarm's speed,
    and its samples were extrapolated, until it expired (16-34 s after a leave in the 16-peer lab, where
    the leaver's stores went through a relay). Here every store takes a second (patched into the DHT
    processes, which fork from this one); hivemind's own goodbye did not wait for it."""
    monkeypatch.setattr(DHTProtocol, "call_store", _slow_call_store)
    trackers = []
    with loopback_dhts(tmp_path, 2) as (first_dht, leaver_dht):
        try:
            first = tracker_on(first_dht, "goodbye")
            trackers.append(first)
            leaver = tracker_on(leaver_dht, "goodbye")
            first.report_local_progress(0, 8)
            leaver.report_local_progress(0, 8)
            wait_for(lambda: first.global_progress.num_peers == 2, 30, "the first peer to see the leaver")
            leaver.shutdown()
            leaver_dht.shutdown()  # as the worker's leave_swarm: the DHT right after the trainer
            read_now(first)
            assert first.global_progress.num_peers == 1 and first.alone
        finally:
            for tracker in trackers:
                tracker.shutdown()


@pytest.mark.timeout(60)
def test_a_peers_first_step_is_not_timed_from_the_trackers_start(tmp_path):
    """A worker rests after each step (its compute share), not before its first: the seconds from the
    tracker's start to the first step held no rest, and a returning peer's first records said 5-13
    times its speed. The first rise in samples is not timed; the next one is, from it."""
    with loopback_dhts(tmp_path, 1) as (dht,):
        tracker = tracker_on(dht, "first-step")
        try:
            tracker.report_local_progress(0, 8)  # the first step, right after the start
            assert tracker.performance_ema.num_updates == 0 and tracker.local_progress.samples_per_second < 1.0
            time.sleep(0.5)  # the rest after it, then the next step
            tracker.report_local_progress(0, 16)
            assert 8.0 <= tracker.local_progress.samples_per_second <= 16.5  # 8 samples in a little over 0.5 s
        finally:
            tracker.shutdown()



LIES = {  # what a hostile peer writes in its own, signed, progress record (target batch size 64)
    "an epoch far ahead": {"epoch": 1000},
    "a time long past": {"time": -10.0 ** 6},  # seconds from now: its samples extrapolated at 3/s over 11 days
    "a huge speed": {"samples_per_second": 10.0 ** 9},
    "the target's samples": {"samples_accumulated": 64},
}


def store_lie(dht, prefix: str, lie: dict) -> None:
    """Store a progress record for the run ``prefix``, signed by ``dht``'s own key as any peer's is, saying ``lie``."""
    validator = RSASignatureValidator(signing_key(dht))
    dht.add_validators([SchemaValidator(TrainingProgressSchema, prefix=prefix), validator])
    now = get_dht_time()
    record = {"peer_id": dht.peer_id.to_bytes(), "epoch": 0, "samples_accumulated": 4, "samples_per_second": 3.0,
              "time": now, "client_mode": False, **lie}
    record["time"] = now + lie.get("time", 0.0)
    assert dht.store(f"{prefix}_progress", subkey=validator.local_public_key, value=record, expiration_time=now + 60)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("lie", LIES)
def test_one_hostile_record_does_not_move_the_swarms_epoch_or_end_it(tmp_path, lie):
    """Three honest peers on epoch 0 hold 12 of 64 samples; a fourth writes one lie. Believed as hivemind
    believes every record, each lie ends the epoch at once for every reader (the far epoch: every reader
    thinks itself behind and downloads the state, again and again): the swarm steps at every local step."""
    trackers = []
    with loopback_dhts(tmp_path, 4) as (reader_dht, *honest_dhts, liar_dht):
        try:
            trackers += [tracker_on(dht, "lies") for dht in (reader_dht, *honest_dhts)]
            for tracker in trackers:
                tracker.report_local_progress(0, 4)
            store_lie(liar_dht, "lies", LIES[lie])
            wait_for(lambda: len((reader_dht.get("lies_progress", latest=True) or (None,))[0] or {}) == 4, 30,
                     "the reader to find all four records")
            reader = trackers[0]
            read_now(reader)
            assert reader.global_epoch == 0 and not reader.ready_to_update_epoch, \
                (reader.global_progress, lie)
        finally:
            for tracker in trackers:
                tracker.shutdown()
