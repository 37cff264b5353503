"""Progress shards and their summaries (``progress_shards``): the layout, the sums, and what a reader believes."""

from __future__ import annotations

import pytest
from hivemind.p2p import PeerID

from p2ptrain.peers.swarm import progress_shards as shards
from p2ptrain.peers.swarm.progress_checks import SPEED_SLACK

NOW = 1_000_000.0
TARGET = 4096


def record(epoch: int = 5, samples: int = 40, speed: float = 2.0, age: float = 3.0, client: bool = False) -> dict:
    return {"peer_id": PeerID.from_base58("QmVhJVRSYHNSHgR9dJNbDxu6G7GNwHrYE9QXoWMzVRTrmz").to_bytes(), "epoch": epoch,
            "samples_accumulated": samples, "samples_per_second": speed, "time": NOW - age, "client_mode": client}


def shard_summary(shard: int, records: list[dict], layout: int = 4, at: float = NOW) -> dict:
    return shards.summarize({f"key{index}".encode(): entry for index, entry in enumerate(records)}, layout, shard,
                            record()["peer_id"], at)


def test_a_swarm_doubles_its_shards_past_the_records_a_shard_holds_and_halves_them_under_a_quarter():
    assert shards.shards_for(32, 1) == 1 and shards.shards_for(33, 1) == 2 and shards.shards_for(1000, 1) == 32
    assert shards.shards_for(17, 2) == 2  # between a quarter and all of a shard's records: it stays
    assert shards.shards_for(15, 2) == 1 and shards.shards_for(100, 32) == 8
    assert shards.shards_for(1, 4, shard_records=2) == 2  # a lab's small shards


def test_a_shard_splits_in_two_when_the_shards_double():
    for index in range(200):
        key = f"peer {index}".encode()
        assert shards.shard_of(key, 8) in (shards.shard_of(key, 4), shards.shard_of(key, 4) + 4)
    assert shards.shard_key("run_progress", 1, 0) == "run_progress"
    assert shards.shard_key("run_progress", 8, 3) == "run_8.3_progress" and shards.summary_key("run_progress").endswith("_progress")


def test_a_summary_stands_for_its_records_in_hivemind_s_estimate():
    records = [record(samples=40, speed=2.0, age=3.0), record(samples=10, speed=0.5, age=20.0),
               record(epoch=4, samples=7, speed=1.0), record(samples=5, speed=1.0, age=1.0, client=True)]
    summary = shard_summary(1, records)
    assert shards.well_formed(summary) and summary["peers"] == 4

    def estimate(entries, epoch):  # hivemind's: samples on the epoch extrapolated at each speed, and every speed
        return (sum(entry["samples_accumulated"] + (NOW - entry["time"]) * entry["samples_per_second"]
                    for entry in entries if entry["epoch"] == epoch), sum(entry["samples_per_second"] for entry in entries))

    assert estimate(shards.pseudo_records(summary, NOW), 5) == pytest.approx(estimate(records, 5))
    assert estimate(shards.pseudo_records(summary, NOW), 4) == pytest.approx(estimate(records, 4))


def believe(summaries: list[dict], own: list[dict] | None = None, local_epoch: int = 5, **kwargs) -> shards.SummaryBelief:
    own = own if own is not None else [record(), record()]
    return shards.believe_summaries(summaries, 4, 0, own, local_epoch, TARGET, 60.0, NOW, **kwargs)


def honest(shard: int, peers: int = 2, **fields) -> dict:
    return shard_summary(shard, [record(**fields) for _ in range(peers)])


def test_honest_summaries_of_the_other_shards_are_believed_and_counted():
    belief = believe([honest(1), honest(2, peers=3), honest(0, peers=9), honest(3, peers=2, client=True)])
    # its own shard's summary (shard 0) is not read: its records are
    assert belief.peers == 7 and belief.clients == 2 and not belief.doubts
    assert {place[0] for place in belief.records} == {1, 2, 3}


@pytest.mark.parametrize("lie, doubt", [
    ({"epoch": 1000}, "on epoch 1000"),
    ({"samples": 10 ** 6}, "counted as at most"),
    ({"speed": 1e9}, "counted as at most"),
])
def test_a_lying_summary_alone_for_its_shard_does_not_move_or_end_the_epoch(lie, doubt):
    liar = honest(3, **lie)
    belief = believe([honest(1), honest(2), liar])
    assert any(doubt in line for line in belief.doubts), belief.doubts
    samples = sum(entry["samples_accumulated"] + (NOW - entry["time"]) * entry["samples_per_second"]
                  for entry in belief.records.values() if entry["epoch"] == 5)
    assert max(entry["epoch"] for entry in belief.records.values()) == 5
    # the liar counts at most SPEED_SLACK times the typical peer's samples, or an even share of the batch, for
    # each of its 2 peers (8 in all), and SPEED_SLACK times the typical speed: far from the epoch's end
    honest_samples = 3 * 2 * (40 + 3 * 2.0)
    most = 2 * (max(SPEED_SLACK * 40, TARGET / 8) + 3 * 2.0 * SPEED_SLACK)
    assert samples <= honest_samples + most < TARGET / 2, samples


def test_of_two_summaries_of_a_shard_the_lower_counts_and_of_three_the_median():
    inflated, fair = honest(1, samples=4000), honest(1)
    assert believe([inflated, fair]).records[(1, 5)]["samples_accumulated"] == 40 * 2
    low = honest(1, samples=0)
    assert believe([inflated, fair, low]).records[(1, 5)]["samples_accumulated"] == 40 * 2


def test_summaries_of_another_layout_too_old_too_large_or_banned_are_left_out():
    other_layout = shard_summary(1, [record()], layout=8)
    stale = shard_summary(1, [record()], at=NOW - 200)
    too_large = honest(2, peers=5 * shards.SHARD_RECORDS)
    banned = honest(3)
    belief = believe([other_layout, stale, too_large, banned, {"shards": 4}],
                     banned={PeerID(banned["peer_id"]).to_base58()})
    assert not belief.records and belief.peers == 0 and len(belief.doubts) == 4, belief.doubts


def test_a_summary_one_epoch_ahead_moves_the_swarm_only_once_half_the_batch_is_believed():
    ahead = honest(1, epoch=6)
    held = believe([ahead, honest(2)])
    assert held.records[(1, 6)]["client_mode"] and any("not followed yet" in line for line in held.doubts)
    full = believe([ahead, honest(2, samples=TARGET // 2)], own=[record(samples=TARGET // 4)] * 2)
    assert not full.records[(1, 6)]["client_mode"]


def test_a_newcomer_whose_shard_holds_only_itself_takes_the_swarms_epoch_from_the_summaries():
    belief = believe([honest(1, epoch=57), honest(2, epoch=57), honest(3, epoch=57)], own=[record(epoch=0)], local_epoch=0)
    assert {entry["epoch"] for entry in belief.records.values()} == {57} and belief.peers == 6


def test_every_peer_follows_the_layout_holding_the_most_peers():
    in_two = [shard_summary(index, [record()] * 6, layout=2) for index in range(2)]
    assert shards.followed_layout(in_two, 1, 5, NOW, 60.0) == 2  # 12 peers in 2 shards, 5 in one
    assert shards.followed_layout(in_two, 1, 13, NOW, 60.0) == 1
    assert shards.followed_layout(in_two, 4, 12, NOW, 60.0) == 4  # as many: the layout with more shards
    assert shards.followed_layout([{**summary, "time": NOW - 100} for summary in in_two], 1, 5, NOW, 60.0) == 1


def test_only_the_lowest_hashes_of_a_shard_summarize():
    keys = [f"peer {index}".encode() for index in range(10)]
    assert sum(shards.summarizes(key, keys) for key in keys) == shards.SUMMARIZERS
    assert shards.summarizes(keys[0], [])  # alone in its shard (its own record not read back yet)
