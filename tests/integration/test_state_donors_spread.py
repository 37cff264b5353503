"""State downloads spread over the peers that can serve them (``RobustAverager.state_sharing_priority``).

Eight real averagers on 127.0.0.1 (DHTs and averagers in this process): two
donors at the swarm's epoch and six joiners behind it, who download the state
one after another, 16 times. A joiner takes the highest declared priority; a
donor declares its epoch less a fraction for each download it served lately.
So at every moment the two donors have served within one download of each
other. hivemind's priority (the epoch alone, ties broken at random) keeps the
counts that close through 16 downloads about one time in 250.

A donor serves at most ``MAX_SERVES_AT_ONCE`` downloads at once and answers the
next with nothing (busy); a downloader waits for the newest epoch's donors a
while, then asks the older ones. So a peer that declares a far epoch and answers
every download with nothing delays a joiner by ``NEWEST_EPOCH_WAIT_S``, not for
good. (A burst of joiners spread over the donors by that limit, in the network
lab: ``tests/netlab/test_state_burst_lab.py``.)
"""

from __future__ import annotations

import contextlib
import time
from typing import AsyncIterator

import pytest
import torch
from hivemind.p2p import P2PContext
from hivemind.proto import averaging_pb2

from p2ptrain.peers.robust.averager import BUSY_WAIT_S, NEWEST_EPOCH_WAIT_S, RECENT_SERVES_S
from p2ptrain.peers.robust.reduce import RobustOptions
from p2ptrain.peers.training.diloco import PseudoGradientAverager

from test_state_download_check import SHAPES, Served, start_dhts, wait_for_sharers

pytestmark = [pytest.mark.swarm]

PREFIX = "spread_diloco"
SWARM_EPOCH = 7


def averager(dht, epoch: int, share: bool) -> PseudoGradientAverager:
    tensors = [torch.ones(shape) * epoch for shape in SHAPES] + [torch.zeros(shape) for shape in SHAPES]
    made = PseudoGradientAverager(
        state_provider=Served({"epoch": epoch}, tensors), averaged_tensors=[torch.zeros(shape) for shape in SHAPES],
        dht=dht, prefix=PREFIX, min_matchmaking_time=2.0, request_timeout=1.0, start=True, allow_state_sharing=share,
        robust=RobustOptions.for_pseudo_gradients(max_weight=1e6, inner_lr=1e-3, rounds_held=1.0, parameter_count=len(SHAPES)))
    if share:
        made.state_sharing_priority = epoch
    return made


def declared(dht, donor) -> float | None:
    found = dht.get(f"{PREFIX}.all_averagers", latest=True)
    record = (found.value if found is not None else {}).get(donor.peer_id.to_bytes())
    return None if record is None else record.value


@contextlib.contextmanager
def two_donors_and_six_joiners():
    """Eight DHT peers; two averagers at the swarm's epoch that share their state, six behind it that do not;
    yields ``(dhts, donors, joiners)`` once a joiner sees both donors, and shuts every one down after."""
    dhts = start_dhts(8)
    averagers = []
    try:
        donors = [averager(dht, SWARM_EPOCH, share=True) for dht in dhts[:2]]
        joiners = [averager(dht, 1, share=False) for dht in dhts[2:]]
        averagers += donors + joiners
        wait_for_sharers(dhts[2], PREFIX, 2)
        yield dhts, donors, joiners
    finally:
        for made in averagers:
            made.shutdown()
        for dht in dhts:
            dht.shutdown()


@pytest.mark.timeout(240)
def test_sixteen_downloads_alternate_between_two_donors_at_the_same_epoch():
    assert RECENT_SERVES_S > 120, "the test's downloads must all count as recent"
    with two_donors_and_six_joiners() as (dhts, donors, joiners):
        served = {donor.peer_id.to_base58(): 0 for donor in donors}
        for download in range(16):
            joiner = joiners[download % len(joiners)]
            loaded = joiner.load_state_from_peers(timeout=30)
            assert loaded is not None and loaded[0] == {"epoch": SWARM_EPOCH}, f"download {download} failed"
            source = joiner.last_state_source
            served[source] += 1
            assert max(served.values()) - min(served.values()) <= 1, f"after {download + 1} downloads: {served}"
            # the donor re-declares its lower priority once it has served: let it reach the next joiner (a
            # few tenths of a second; without the lower priority the declared value never changes)
            donor = next(donor for donor in donors if donor.peer_id.to_base58() == source)
            count, deadline = served[source], time.monotonic() + 10
            while (declared(dhts[2 + (download + 1) % len(joiners)], donor) != pytest.approx(SWARM_EPOCH - count / (count + 1))
                   and time.monotonic() < deadline):
                time.sleep(0.1)
        assert sorted(served.values()) == [8, 8]
        assert sorted(donor.recent_serves for donor in donors) == [8, 8]


async def answer_nothing(self, request: averaging_pb2.DownloadRequest,
                         context: P2PContext) -> AsyncIterator[averaging_pb2.DownloadData]:
    """A donor's answer to a download when it is busy: nothing."""
    return
    yield


# a donor that declares its state and is always busy, under the honest class name (a peer's handlers are
# named by its class: another name would not be asked at all)
AlwaysBusy = type("PseudoGradientAverager", (PseudoGradientAverager,), {"rpc_download_state": answer_nothing})


@pytest.mark.timeout(180)
def test_a_donor_that_is_always_busy_at_a_far_epoch_delays_a_joiner_only_for_a_while():
    dhts = start_dhts(3)
    averagers = []
    try:
        honest = averager(dhts[0], SWARM_EPOCH, share=True)
        averagers.append(honest)
        tensors = [torch.ones(shape) for shape in SHAPES] * 2
        busy = AlwaysBusy(
            state_provider=Served({"epoch": 1000}, tensors), averaged_tensors=[torch.zeros(shape) for shape in SHAPES],
            dht=dhts[1], prefix=PREFIX, min_matchmaking_time=2.0, request_timeout=1.0, start=True, allow_state_sharing=True,
            robust=RobustOptions.for_pseudo_gradients(max_weight=1e6, inner_lr=1e-3, rounds_held=1.0, parameter_count=len(SHAPES)))
        busy.state_sharing_priority = 1000
        averagers.append(busy)
        joiner = averager(dhts[2], 1, share=False)
        averagers.append(joiner)
        wait_for_sharers(dhts[2], PREFIX, 2, top_priority=1000)
        began = time.monotonic()
        loaded = joiner.load_state_from_peers(timeout=120)
        waited = time.monotonic() - began
        assert loaded is not None and loaded[0] == {"epoch": SWARM_EPOCH}, loaded
        assert joiner.last_state_source == honest.peer_id.to_base58()
        # it waited for the far epoch's donor to be free, then took the newest state another donor had
        assert NEWEST_EPOCH_WAIT_S <= waited < BUSY_WAIT_S, waited
    finally:
        for made in averagers:
            made.shutdown()
        for dht in dhts:
            dht.shutdown()


@pytest.mark.timeout(240)
def test_a_declaration_goes_straight_to_the_holders(tmp_path, monkeypatch, meter):
    # hivemind searched every node of the 20 nearest to the key before each declaration (a download still searches)
    from p2ptrain.peers.net.request_log import ENVIRONMENT_VARIABLE

    logs = tmp_path / "requests"
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, str(logs))  # before the DHT processes fork: they log too
    with two_donors_and_six_joiners() as (_, _, joiners):
        for _ in range(2):  # the first downloads find the key's holders (a search each, kept 30 s); the second are measured
            started = time.time()
            for joiner in joiners:
                loaded = joiner.load_state_from_peers(timeout=30)
                assert loaded is not None and loaded[0] == {"epoch": SWARM_EPOCH}
            ended = time.time()
    calls = [line.split("\t") for path in logs.glob("*.tsv") for line in path.read_text().splitlines()]
    calls = [fields for fields in calls if fields[1] == "call" and fields[4] == f"{PREFIX}.all_averagers"
             and started <= float(fields[0]) <= ended]
    finds = sum(1 for fields in calls if fields[3].endswith("rpc_find"))
    stores = sum(1 for fields in calls if fields[3].endswith("rpc_store"))
    print(f"{len(joiners)} downloads: rpc_find {finds}, rpc_store {stores}")
    # each download served lowers the donor's priority, which it declares again, with 5 stores (one to each holder)
    # and no search; a download searches (all 7 other nodes; once more after a busy donor): 42 measured. hivemind
    # searched before each declaration as well, 7 finds more each
    assert finds <= 7 * (len(joiners) + 1), finds
    assert stores <= 5 * 2 * len(joiners), stores
