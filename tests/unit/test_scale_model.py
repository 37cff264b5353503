"""The model of per-peer background traffic (``benchmarks/scale_model.py``) against the scale lab's
measured rows, and the growth laws it rests on.

Fitted to the request log of the 8-peer run after ed0023b (at 6d2e971) only, the model must reproduce the rows it
was not fitted to: 2 and 4 peers within 25 % (mean peer), and the 8-peer runs whose stores searched
first within 10 %, each row under the design of its own commit (every measured row read by hivemind's
search: they predate 46082cf). The laws: a search asks the min(N - 1, 20) nodes nearest to the key
(hivemind's own traverse_dht says so), a network read's answer grows linearly in N, a holder answers the
stores of all N - 1 others, from 46082cf a peer that holds no copy read 2 holders, as the
integration test measured, and now 1; since 4262333 the peers behind NAT serve nothing: they only ask.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import scale_model  # noqa: E402

COUNTS = scale_model.read_request_counts(REPO / "benchmarks" / scale_model.REQUEST_LOG)
FIT_ROW = scale_model.measured_row(*scale_model.FIT_ROW)
FITTED = scale_model.fit(COUNTS, FIT_ROW)
ACTIVITY = scale_model.activity_of(FIT_ROW)
DATA = REPO / "benchmarks" / "scale_model_2026-11-27.jsonl"  # RESULTS.md's scale-model table


def test_the_request_log_says_which_peers_hold_the_progress_key():
    progress = scale_model.keys_of(COUNTS, "progress")
    assert len(COUNTS) == 8 and len(progress) == 1
    assert {peer for peer, counts in COUNTS.items() if scale_model.is_holder(counts, progress[0])} == {"pub", "h1", "h4", "h6", "h7"}


def test_fitted_sizes_are_those_of_signed_records():
    # a signed entry: an RSA public key as subkey, a signature, the record: most of a kilobyte
    assert 700 < FITTED.entry_bytes["progress"] < 1000 and 900 < FITTED.entry_bytes["metrics"] < 1300
    # a store carries one entry and a few dozen bytes of request
    for kind in scale_model.RECORD_KINDS:
        assert 0 < FITTED.store_bytes[kind] - FITTED.entry_bytes[kind] < 200
    # about one progress store a step: 8 steps an epoch in the lab, and the epoch's change
    assert 7 < FITTED.progress_stores_per_epoch < 11


@pytest.mark.parametrize("file, peers, commit, design", scale_model.MEASURED,
                         ids=[f"{peers}-{commit}" for _, peers, commit, _ in scale_model.MEASURED])
def test_the_model_reproduces_each_measured_mean(file, peers, commit, design):
    row = scale_model.measured_row(file, peers, commit)
    modelled = scale_model.model(peers, FITTED, scale_model.activity_of(row), design)["mean"]["bytes_per_s"]
    measured = scale_model.metered_background(row)["mean"]
    assert abs(modelled / measured - 1) < (0.10 if peers == 8 else 0.25), (modelled, measured)


def _descends_from(commit: str, ancestor: str) -> bool:
    return subprocess.run(["git", "merge-base", "--is-ancestor", ancestor, commit], cwd=REPO).returncode == 0


@pytest.mark.parametrize("file, peers, commit, design", scale_model.MEASURED,
                         ids=[f"{peers}-{commit}" for _, peers, commit, _ in scale_model.MEASURED])
def test_each_measured_row_is_checked_against_the_store_and_read_path_of_its_commit(file, peers, commit, design):
    full = scale_model.measured_row(file, peers, commit)["commit"].removesuffix("-dirty")  # run on that commit, edited
    if shutil.which("git") is None or subprocess.run(["git", "cat-file", "-e", f"{full}^{{commit}}"], cwd=REPO,
                                                     capture_output=True).returncode:
        pytest.skip("no git history here to date the commit")
    assert design.search_before_store == (not _descends_from(full, "ed0023b"))  # stores to remembered holders
    assert (design.holders_per_read == 2) == (_descends_from(full, "46082cf") and not _descends_from(full, "4262333"))
    assert (design.serving_share is not None) == _descends_from(full, "4262333")  # the peers behind NAT serve nothing
    assert design.holders_per_read in (0, 2, scale_model.HOLDERS_PER_READ) and not design.paced_stores and not design.read_entries


def test_without_the_search_before_each_store_the_model_sees_the_measured_drop():
    before, after = (scale_model.model(8, FITTED, ACTIVITY, design)["mean"]["bytes_per_s"]
                     for design in (scale_model.BEFORE, scale_model.SEARCH_READS))
    assert 2.5 < before / after < 4.5  # measured: 78.3 KB/s before, 22.9 after (both reading by hivemind's search)


def _read_bytes(design, peers=8, kind="metrics") -> float:
    """Bytes of one read by a peer that holds no copy, as the model charges it."""
    swarm = scale_model.Swarm(peers)
    return sum(requests * size for requests, size in
               swarm.read_requests(scale_model.record_key(kind, swarm, FITTED, ACTIVITY, design)))


def test_a_peer_that_holds_no_copy_reads_two_answers_of_n_entries_as_the_code_did():
    peers, entry = 8, FITTED.entry_bytes["metrics"]
    answer = scale_model.find_bytes(scale_model.neighbours_in_answer(peers)) + peers * entry
    whole_value = peers * entry + scale_model.store_overhead_bytes()
    assert scale_model.HOLDERS_PER_READ == 1 and scale_model.NOW.holders_per_read == 1
    assert _read_bytes(scale_model.TWO_HOLDERS) == pytest.approx(2 * answer)
    assert _read_bytes(scale_model.SEARCH_READS) == pytest.approx(7 * answer + whole_value)  # then cache_nearest

    # what the model charges the farthest peer (no holder, answering no read now) per read it makes
    with_reads, without = scale_model.Swarm(peers), scale_model.Swarm(peers)
    key = scale_model.record_key("metrics", with_reads, FITTED, ACTIVITY, scale_model.TWO_HOLDERS)
    with_reads.add_key(key)
    without.add_key(dataclasses.replace(key, reads=0.0))
    farthest = max(key.ranks, key=key.ranks.get)
    charged = with_reads.special[farthest].bytes["metrics"] - without.special[farthest].bytes["metrics"]
    assert charged / key.reads == pytest.approx(2 * answer)

    # tests/integration/test_local_reads.py measured a non-holder's read at 8 peers: 17,670 B from 2 holders,
    # 47,847 B by hivemind's search (ratio 0.370). In that test the 5 holders held the records but the 2 other
    # nodes asked held no cached copy (nobody had read), so 2 of the 7 answers carried node lists only, and
    # hivemind's cache store followed 0 to 3 of its 3 reads (only when the value found is newer than the
    # reader's own copy). The model's pieces put together so must bracket the measured ratio: that range
    # (0.33 to 0.39 with the lab's entries) is the tolerance. The model's own ratio is lower, about 2 / 8:
    # in a swarm where every peer reads, every node asked answers from a cached copy, and every read caches.
    measured = 17_670 / 47_847
    nodes_only = scale_model.find_bytes(scale_model.neighbours_in_answer(peers))
    searched = 5 * answer + 2 * nodes_only
    assert 2 * answer / (searched + whole_value) < measured < 2 * answer / searched
    assert _read_bytes(scale_model.TWO_HOLDERS) / _read_bytes(scale_model.SEARCH_READS) < measured


@pytest.mark.parametrize("peers", [12, 60])
def test_a_search_asks_the_nearest_nodes_and_no_more_than_a_bucket(peers):
    for searcher, asked in scale_model.simulated_searches(peers, searches=4):
        assert len(asked) == scale_model.search_visits(peers) == min(peers - 1, scale_model.BUCKET_SIZE)
        assert asked == [rank for rank in range(peers) if rank != searcher][:len(asked)]


def test_a_network_read_grows_linearly_in_the_swarm():
    def read_bytes(peers):
        swarm = scale_model.Swarm(peers)
        return scale_model.record_key("progress", swarm, FITTED, ACTIVITY, scale_model.NOW).value_bytes

    assert read_bytes(200) == pytest.approx(2 * read_bytes(100))
    bounded = scale_model.BOUNDED_READS
    assert scale_model.record_key("progress", scale_model.Swarm(1000), FITTED, ACTIVITY, bounded).value_bytes == \
        pytest.approx(read_bytes(scale_model.BOUNDED_READ_ENTRIES))


def test_the_worst_peer_grows_as_n_squared_and_the_mean_as_n():
    small, middle, large = (scale_model.model(peers, FITTED, ACTIVITY) for peers in (100, 550, 1000))
    # the nodes nearest to a record key or a group key (10 if linear; the linear parts weigh most at 100)
    assert large["worst"]["bytes_per_s"] / small["worst"]["bytes_per_s"] > 30

    def growth(side):  # 2 when linear in N, (1000^2 - 100^2) / (550^2 - 100^2) = 3.4 when quadratic
        return (large[side]["bytes_per_s"] - small[side]["bytes_per_s"]) / (middle[side]["bytes_per_s"] - small[side]["bytes_per_s"])

    assert 1.9 < growth("mean") < 2.1 and growth("worst") > 3


@pytest.mark.parametrize("design", [scale_model.NOW, scale_model.BOUNDED_READS], ids=["now", "bounded"])
def test_the_holders_answer_every_store_and_share_every_read(design):
    peers = 1000
    swarm = scale_model.Swarm(peers)
    key = scale_model.record_key("progress", swarm, FITTED, ACTIVITY, design)
    swarm.add_key(key)
    stores, reads = scale_model.stores_per_s("progress", FITTED, ACTIVITY, design), key.reads
    others = peers - scale_model.NUM_REPLICAS
    far = swarm.anyone.requests["progress"]
    for rank in range(scale_model.NUM_REPLICAS):
        holder = swarm.special[next(node for node, found in key.ranks.items() if found == rank)].requests["progress"]
        # it stores to one holder fewer and reads nothing; it answers every store and every holder search, and
        # its share of every other peer's reads (each asks holders_per_read of the holders, picked at random)
        answered = stores * (peers - 1) + (peers - 1) / scale_model.HOLDERS_MEMORY_S
        answered += reads * others * design.holders_per_read / scale_model.NUM_REPLICAS
        assert holder - far == pytest.approx(answered - stores - reads * design.holders_per_read), rank


def test_a_fetch_of_a_group_key_asks_one_holder_not_a_bucket_and_its_answer_lists_every_leader():
    peers = 400
    searched, read = (scale_model.matchmaking_key("grad", scale_model.Swarm(peers, 100), FITTED, ACTIVITY, design)
                      for design in (scale_model.METRICS_SHARDED, scale_model.GROUP_KEYS))
    searches = FITTED.matchmaking_searches_per_epoch * ACTIVITY.epochs_per_s
    assert searched.value_search == (searches, searches) and searched.reads == 0
    assert read.value_search == (0.0, 0.0) and read.reads == searches and read.read_holders == 1
    leaders = scale_model.leading_peers(peers)
    assert leaders == 100 and read.value_bytes == searched.value_bytes == pytest.approx(
        leaders * FITTED.matchmaking_value_bytes / scale_model.FIT_LEADERS)
    # each leader declares and withdraws in each round: stores to the holders, averaged over every peer
    assert read.stores * peers == pytest.approx(scale_model.DECLARATIONS_PER_ROUND * ACTIVITY.epochs_per_s * leaders)
    by_search, by_holders = (scale_model.model(peers, FITTED, ACTIVITY, design)["mean"]["requests_per_min"]["matchmaking"]
                             for design in (dataclasses.replace(scale_model.METRICS_SHARDED, donors_from_holders=True),
                                            dataclasses.replace(scale_model.GROUP_KEYS, donors_from_holders=True)))
    assert by_holders < by_search / 4  # what is left: the holders searched for every 30 s, and the stores
    # in groups (not built) each key holds a group's leaders: the holders' answers no longer grow with N
    one_key, in_groups = (scale_model.model(1000, FITTED, ACTIVITY, design)
                          for design in (scale_model.GROUP_KEYS, scale_model.GROUPS))
    assert in_groups["mean"]["by_kind"]["matchmaking"] < one_key["mean"]["by_kind"]["matchmaking"] / 3
    assert in_groups["worst"]["by_kind"]["matchmaking"] < 50_000  # 879 KB/s at a holder of the one key


def test_state_donors_declare_each_epoch_with_a_search_by_hivemind_and_straight_to_the_holders_now():
    peers = 400
    searched, stored = (scale_model.donors_key("grad", scale_model.Swarm(peers, 100), FITTED, ACTIVITY, design)
                        for design in (scale_model.PACED_SUMMARIES, scale_model.DONORS))
    leaders = scale_model.leading_peers(peers)
    declarations = ACTIVITY.epochs_per_s * leaders / peers  # a leader's each epoch, averaged over every peer
    assert searched.stores == stored.stores == pytest.approx(declarations)
    assert searched.value_search == (declarations, declarations) and stored.value_search == (0.0, 0.0)
    assert stored.holder_search[1] == pytest.approx(leaders / peers / scale_model.HOLDERS_MEMORY_S)
    assert searched.value_bytes == stored.value_bytes == pytest.approx(leaders * FITTED.matchmaking_value_bytes)


def test_the_data_file_is_what_the_model_says_now():
    row = json.loads(DATA.read_text().splitlines()[-1])
    now = json.loads(json.dumps({"fitted": dataclasses.asdict(FITTED), "check": scale_model.check(FITTED),
                                 "projection": scale_model.projection(FITTED, ACTIVITY)}))
    assert {name: row[name] for name in now} == now, (
        "the model changed: nice -n 19 .venv/bin/python benchmarks/scale_model.py --json benchmarks/scale_model_<date>.jsonl, "
        "then .venv/bin/python benchmarks/results.py --write")


def test_a_peer_behind_nat_answers_nothing_and_asks_its_stores_searches_and_reads():
    peers, servers = 100, 25
    swarm = scale_model.Swarm(peers, servers)
    key = scale_model.record_key("progress", swarm, FITTED, ACTIVITY, scale_model.NOW)
    swarm.add_key(key)
    stores = scale_model.stores_per_s("progress", FITTED, ACTIVITY, scale_model.NOW)
    asked = (stores * scale_model.NUM_REPLICAS + min(servers, scale_model.BUCKET_SIZE) / scale_model.HOLDERS_MEMORY_S
             + key.client_reads * scale_model.HOLDERS_PER_READ)
    assert swarm.client.requests["progress"] == pytest.approx(asked)
    assert set(key.ranks) <= set(range(servers))  # only the serving peers are near a key


def test_past_a_bucket_of_serving_peers_the_same_requests_are_answered_by_fewer():
    # every search asks a bucket, every read one holder: the swarm's bytes stay, only who answers them changes
    everyone = scale_model.model(400, FITTED, ACTIVITY, dataclasses.replace(scale_model.NOW, serving_share=None))
    quarter = scale_model.model(400, FITTED, ACTIVITY, scale_model.NOW)
    assert quarter["mean"]["bytes_per_s"] == pytest.approx(everyone["mean"]["bytes_per_s"], rel=0.02)
    assert quarter["worst"]["bytes_per_s"] > everyone["worst"]["bytes_per_s"]
    # below a bucket, a search asks every serving peer: fewer of them, fewer requests
    small = [scale_model.model(8, FITTED, ACTIVITY, design)["mean"]["bytes_per_s"]
             for design in (dataclasses.replace(scale_model.NOW, serving_share=None), scale_model.NOW)]
    assert small[1] < small[0]
