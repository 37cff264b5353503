"""What a reader believes of other peers' progress records (``progress_checks``): each check on its own.

The records are dicts as hivemind stores them; the swarm in each test is a few
honest peers (3 samples/s, as the scale lab's peers at a 0.12 compute share)
and at most one liar. ``integration/test_progress_records.py`` and the network
lab's ``test_progress_lies_lab.py`` put a liar's signed record in a real DHT.
"""

from __future__ import annotations

import pytest
from hivemind.p2p import PeerID

from p2ptrain.peers.swarm.progress_checks import CLOCK_SKEW_S, RISE_WINDOW_S, SPEED_SLACK, ProgressChecks

NOW = 1_800_000_000.0
TARGET = 1024
OWN = b"own-key"


def record(name: str, epoch: int = 5, samples: int = 100, speed: float = 3.0, age: float = 2.0, client: bool = False,
           now: float = NOW) -> dict:
    return {"peer_id": PeerID(name.encode()).to_bytes(), "epoch": epoch, "samples_accumulated": samples,
            "samples_per_second": speed, "time": now - age, "client_mode": client}


def swarm(*liars: dict, honest: int = 3) -> dict:
    """This peer's record, ``honest`` others' and the ``liars``, keyed by signing key as the DHT returns them."""
    records = {OWN: record("own"), **{f"key-{index}".encode(): record(f"peer-{index}") for index in range(honest)}}
    records.update({f"liar-{index}".encode(): liar for index, liar in enumerate(liars)})
    return records


def checks(banned=()) -> ProgressChecks:
    return ProgressChecks(TARGET, lifetime_s=60.0, banned=banned)


def test_honest_records_are_believed_as_they_are_and_doubt_nothing():
    records = swarm(honest=4)
    belief = checks().believe(records, OWN, own_speed=3.0, now=NOW)
    assert belief.records == records and belief.doubts == []


def test_a_record_dated_in_the_future_is_left_out():
    belief = checks().believe(swarm(record("liar", age=-CLOCK_SKEW_S - 5)), OWN, 3.0, NOW)
    assert b"liar-0" not in belief.records and len(belief.records) == 4
    assert len(belief.doubts) == 1 and belief.doubts[0].endswith("left out")


@pytest.mark.parametrize("age", [60 + CLOCK_SKEW_S + 5, 10 ** 9])
def test_a_record_past_its_lifetime_counts_as_dated_now_its_samples_not_extrapolated(age):
    belief = checks().believe(swarm(record("old", age=age)), OWN, 3.0, NOW)
    assert belief.records[b"liar-0"]["time"] == NOW and belief.records[b"liar-0"]["samples_accumulated"] == 100


def test_a_record_within_the_clock_skew_or_its_lifetime_is_believed():
    belief = checks().believe(swarm(record("late", age=-CLOCK_SKEW_S + 5), record("old", age=60 + CLOCK_SKEW_S - 5)), OWN, 3.0, NOW)
    assert {b"liar-0", b"liar-1"} <= set(belief.records) and belief.doubts == []


def test_an_epoch_far_ahead_of_the_others_is_left_out_and_one_ahead_does_not_move_the_swarm():
    belief = checks().believe(swarm(record("far", epoch=1000), record("next", epoch=6)), OWN, 3.0, NOW)
    assert b"liar-0" not in belief.records
    # one ahead: its speed still counts, but as a client's its epoch is not the swarm's
    assert belief.records[b"liar-1"]["client_mode"] is True and belief.records[b"liar-1"]["epoch"] == 6


def test_the_swarm_moves_on_once_two_peers_are_on_the_next_epoch():
    records = swarm(record("first", epoch=6), record("second", epoch=6))
    belief = checks().believe(records, OWN, 3.0, NOW)
    assert belief.records == records


def test_the_first_peer_to_step_moves_the_swarm_once_half_the_batch_is_believed_on_the_epoch():
    early = swarm(record("first", epoch=6, samples=0))  # 4 records of 100 samples on epoch 5: 400 of 1,024
    assert checks().believe(early, OWN, 3.0, NOW).records[b"liar-0"]["client_mode"] is True
    late = {key: {**value, "samples_accumulated": 130} for key, value in early.items()}  # 520 of 1,024
    late[b"liar-0"] = record("first", epoch=6, samples=0)
    assert checks().believe(late, OWN, 3.0, NOW).records == late


def test_a_peer_behind_follows_the_swarm_and_a_lone_other_peer_is_followed():
    # this peer just joined (epoch 0): the others' epoch is the swarm's, as in hivemind
    joined = {OWN: record("own", epoch=0, samples=0), b"a": record("a", epoch=40), b"b": record("b", epoch=40)}
    assert checks().believe(joined, OWN, 3.0, NOW).records == joined
    # one other peer on record: nobody to compare it with, it is believed (hivemind's rule)
    alone = {OWN: record("own", epoch=0, samples=0), b"a": record("a", epoch=40)}
    assert checks().believe(alone, OWN, 3.0, NOW).records == alone


def test_a_speed_its_samples_do_not_show_counts_at_most_a_few_times_the_swarms_median():
    reader = checks()
    liar = record("liar", speed=20_000.0, samples=10)
    belief = reader.believe(swarm(liar), OWN, 3.0, NOW)
    assert belief.records[b"liar-0"]["samples_per_second"] == SPEED_SLACK * 3.0
    # its samples rise at 1 a second over the window: still cut
    at = NOW + RISE_WINDOW_S
    later = reader.believe(swarm({**liar, "samples_accumulated": 10 + int(RISE_WINDOW_S), "time": at}), OWN, 3.0, at)
    assert later.records[b"liar-0"]["samples_per_second"] == SPEED_SLACK * 3.0


def test_samples_count_at_most_the_target_batch_size_and_at_first_sight_a_few_times_the_median():
    belief = checks().believe(swarm(record("liar", samples=10 ** 9)), OWN, 3.0, NOW)
    assert belief.records[b"liar-0"]["samples_accumulated"] == SPEED_SLACK * 100  # the others hold 100 each
    records = {key: {**value, "samples_accumulated": 900} for key, value in swarm().items()}
    belief = checks().believe({**records, b"liar": record("liar", samples=10 ** 9)}, OWN, 3.0, NOW)
    assert belief.records[b"liar"]["samples_accumulated"] == TARGET
    belief = checks().believe(records, OWN, 3.0, NOW)
    assert belief.records[b"key-0"]["samples_accumulated"] == 900


def test_the_runs_first_peer_holding_most_of_the_first_epoch_is_believed_by_those_who_join():
    first = record("first", epoch=0, samples=168, speed=1.8)
    joiners = {f"key-{index}".encode(): record(f"joiner-{index}", epoch=0, samples=8) for index in range(3)}
    belief = checks().believe({OWN: record("own", epoch=0, samples=0), b"first": first, **joiners}, OWN, None, NOW)
    assert belief.records[b"first"] == first  # an even share of 1,024 among 5 is 204


def test_a_liars_samples_grow_at_most_at_the_speed_it_is_believed_to_have():
    reader = checks()
    few = {key: {**value, "samples_accumulated": 5} for key, value in swarm(honest=12).items()}  # early in the epoch
    reader.believe({**few, b"liar": record("liar", samples=10)}, OWN, 3.0, NOW)
    later = reader.believe({**few, b"liar": record("liar", samples=TARGET, now=NOW + 10)}, OWN, 3.0, NOW + 10)
    assert later.records[b"liar"]["samples_accumulated"] == 10 + SPEED_SLACK * 3.0 * 10


def test_a_fast_honest_peer_is_believed_in_full_once_its_samples_have_risen_for_two_windows():
    reader, speed = checks(), 30.0  # a GPU among peers of 3 samples/s
    believed = []
    for window in range(3):
        at = NOW + window * RISE_WINDOW_S
        samples = int(speed * window * RISE_WINDOW_S * 0.8)  # read late, the rise looks slower than it was
        belief = reader.believe(swarm(record("gpu", speed=speed, samples=samples, now=at)), OWN, 3.0, at)
        believed.append(belief.records[b"liar-0"]["samples_per_second"])
    # the median's 4 times until a window's rise is measured (at the second read, after the cut), then in full
    assert believed == [SPEED_SLACK * 3.0, SPEED_SLACK * 3.0, speed]
    # its rate is remembered into the next epoch (the samples start again)
    at = NOW + 2 * RISE_WINDOW_S + 5
    next_epoch = reader.believe(swarm(record("gpu", epoch=6, speed=speed, samples=20, now=at), record("next", epoch=6, now=at)),
                                OWN, 3.0, at)
    assert next_epoch.records[b"liar-0"]["samples_per_second"] == speed


def test_a_peer_whose_epochs_end_sooner_than_the_window_is_measured_across_them():
    reader, speed, read_every = checks(), 300.0, 2.5  # the swarm's epoch of 1,024 samples ends every 3.4 s
    samples, epoch, at = 0, 5, NOW
    speeds = []
    while at <= NOW + 5 * RISE_WINDOW_S:
        others = {f"key-{index}".encode(): record(f"peer-{index}", epoch=epoch, samples=20, now=at) for index in range(3)}
        records = {OWN: record("own", epoch=epoch, now=at), **others,
                   b"gpu": record("gpu", epoch=epoch, samples=samples, speed=speed, now=at)}
        speeds.append(reader.believe(records, OWN, 3.0, at).records[b"gpu"]["samples_per_second"])
        at, samples = at + read_every, samples + int(speed * read_every)
        if samples >= TARGET:  # the epoch ends, for everyone
            epoch, samples = epoch + 1, samples - TARGET
    # believed at 4 times the rise of its believed samples each window (100 times the median: four windows)
    assert speeds[0] == SPEED_SLACK * 3.0 and speeds[-1] == speed, speeds


def test_a_peer_that_just_joined_believes_the_only_other_peer_in_full():
    creator = record("creator", samples=900, speed=300.0)
    belief = checks().believe({OWN: record("own", samples=0), b"creator": creator}, OWN, None, NOW)
    assert belief.records[b"creator"] == creator and belief.doubts == []


def test_of_two_peers_the_slower_believes_the_faster_in_full():
    fast = record("fast", speed=60.0)  # five times this peer's speed, more than SPEED_SLACK
    belief = checks().believe({OWN: record("own", speed=12.0), b"fast": fast}, OWN, 12.0, NOW)
    assert belief.records[b"fast"] == fast


def test_one_liar_cannot_raise_the_median_it_is_measured_against():
    liars = [record(f"liar{index}", speed=20_000.0) for index in range(2)]
    belief = checks().believe(swarm(*liars, honest=3), OWN, 3.0, NOW)
    assert {belief.records[key]["samples_per_second"] for key in (b"liar-0", b"liar-1")} == {SPEED_SLACK * 3.0}


def test_a_banned_peers_record_is_left_out_and_an_unban_takes_effect_at_the_next_read():
    banned = {PeerID(b"liar").to_base58()}
    reader = checks(banned)
    assert b"liar-0" not in reader.believe(swarm(record("liar")), OWN, 3.0, NOW).records
    banned.clear()
    assert b"liar-0" in reader.believe(swarm(record("liar")), OWN, 3.0, NOW + 1).records


@pytest.mark.parametrize("field, value", [("epoch", -1), ("epoch", 1.5), ("samples_accumulated", None),
                                          ("samples_per_second", float("inf")), ("samples_per_second", -1.0),
                                          ("time", float("nan")), ("time", "now"), ("peer_id", None),
                                          ("client_mode", "yes")])
def test_a_record_without_a_sound_epoch_samples_speed_or_time_is_left_out(field, value):
    belief = checks().believe(swarm({**record("broken"), field: value}), OWN, 3.0, NOW)
    assert b"liar-0" not in belief.records and len(belief.doubts) == 1


def test_this_peers_own_record_and_an_emptied_record_are_passed_through():
    records = {OWN: record("own", epoch=1000, speed=20_000.0, age=10 ** 6), b"gone": None, b"a": record("a")}
    assert checks().believe(records, OWN, 3.0, NOW).records == records
