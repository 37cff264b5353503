"""Progress records in shards once a swarm outgrows one key, and a signed summary of each shard (issue 25).

hivemind keeps every peer's progress record under one DHT key, and every
peer reads that key every 2-30 s: each read carries all N records, and the
key's few holders answer all N peers' reads. Per peer that grows as N, per
holder as N² (the scale model: 175 KB/s a peer and 11 MB/s at the worst
holder at 1,000 peers, on progress alone).

Past :data:`SHARD_RECORDS` peers the records are spread over ``S`` keys (a
power of two, as few as keep each under :data:`SHARD_RECORDS` records): a
peer stores its record under the shard its signing key hashes to
(:func:`shard_of`, :func:`shard_key`) and reads only that shard. Up to
:data:`SUMMARIZERS` peers of each shard (those whose signing keys hash
lowest, :func:`summarizes`) also store, after each of their reads, a summary
of the shard's records as they believed them (:func:`summarize`): for each
epoch on record, how many peers, their samples and speeds, and the sum of
each record's time by its speed, so that a reader extrapolates the shard's
samples exactly as it would every record's. Every peer reads the summaries
with its own shard, under one key (:func:`summary_key`), each signed by the
peer that wrote it, at most every :data:`SUMMARIES_READ_SHARE` of a record's
lifetime (10 s): a read carries about N / S entries, and one in a few 2 S
summaries more, instead of N: at 1,000 peers 31 + 64, not 1,000.

With one shard (up to :data:`SHARD_RECORDS` peers) the key is hivemind's own:
a small swarm reads and stores as before, and reads the summaries only at its first read and every
:data:`LAYOUT_CHECK_S`, to find a swarm that already runs in shards (a
newcomer's shard of one would otherwise show it alone); its summarizers
write a summary as often, so that peers in shards see it too. Each peer
follows the layout that holds the most peers (:func:`followed_layout`), and
in it picks the number of shards from the peers it sees (:func:`shards_for`:
double past :data:`SHARD_RECORDS` a shard, halve under a quarter of that);
a peer that moves says goodbye in the old key, and stays a record's
lifetime, until the others have moved as well.

A summary is written by a peer of its shard, and a hostile peer may write
one for any shard. :func:`believe_summaries` checks them as
``progress_checks`` checks records: a summary from another layout, dated
ahead or too old, of a shard too large, or from a banned peer is left out;
of a shard's summaries the one with the median samples counts (of two the
lower: a liar that adds samples is outvoted by an honest summarizer, one
that hides them delays its shard's share of the epoch); an epoch more than
one above the swarm's (the highest that two sources hold: the reader's own
shard's records, one a summary) is left out, and an epoch one above it moves
the swarm only once half the batch is believed on the swarm's epoch; samples
count at most ``SPEED_SLACK`` times the typical peer's (the median of the
reader's own shard's records and of the summaries' per-peer means) for each
peer of the shard, or an even share of the batch, and speeds at most
``SPEED_SLACK`` times the median per peer. Not defended: a shard whose only
summarizer lies within those bounds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import statistics
from collections import Counter

from p2ptrain.peers.swarm.progress_checks import CLOCK_SKEW_S, SPEED_SLACK, record_peer_id
from p2ptrain.peers.swarm.records import MAX_SHARDS

# the most records a shard is meant to hold: past it a swarm doubles its shards; under a quarter of it, halves them
SHARD_RECORDS = 32
# how many peers of each shard write its summary (the lowest hashes of its signing keys)
SUMMARIZERS = 2
# seconds between two summaries of one summarizer (the tracker reads every 2-30 s)
SUMMARY_PERIOD_S = 2.0
# a swarm in one shard reads the summaries this often, to find that the others run in shards
LAYOUT_CHECK_S = 30.0
# a swarm in shards reads the summaries at most this often, as a share of a record's lifetime (every 10 s at
# hivemind's 60 s), and its own shard at every read: every peer reads all 2 S summaries from the few holders
# of one key, which made them the worst peer at 1,000 (the scale model); between two reads a reader
# extrapolates each summary from its speeds, as it does a record
SUMMARIES_READ_SHARE = 1 / 6
# the most epochs a summary lists (honest peers are within one epoch of each other; a shard has a few more)
MAX_SUMMARY_EPOCHS = 4


def shard_key(progress_key: str, shards: int, index: int) -> str:
    """The DHT key of shard ``index`` of ``shards`` for the run whose hivemind progress key is
    ``progress_key`` (``<prefix>_progress``): that key itself for one shard. Every key ends with
    ``_progress``, which the traffic meter counts as progress."""
    if shards == 1:
        return progress_key
    return f"{progress_key[:-len('_progress')]}_{shards}.{index}_progress"


def summary_key(progress_key: str) -> str:
    """The DHT key of every shard's summaries for the run whose progress key is ``progress_key``."""
    return f"{progress_key[:-len('_progress')]}_summaries_progress"


def key_hash(signing_key: bytes) -> int:
    """A peer's place among its shard's peers, and which shard it is in: its signing key's hash."""
    return int.from_bytes(hashlib.sha256(signing_key).digest()[:8], "big")


def shard_of(signing_key: bytes, shards: int) -> int:
    """The shard (0 to ``shards`` - 1) whose key holds the record of the peer signing with ``signing_key``.
    With a power of two, shard i of S splits into shards i and i + S of 2 S."""
    return key_hash(signing_key) % shards


def shards_for(peers: int, shards: int, shard_records: int = SHARD_RECORDS) -> int:
    """How many shards a swarm of ``peers`` should use, from ``shards`` now: doubled while a shard would hold
    more than ``shard_records`` (up to ``records.MAX_SHARDS``), halved while one would hold fewer than a quarter
    of that (the gap keeps a swarm near a boundary from moving at every read)."""
    while peers > shard_records * shards and shards < MAX_SHARDS:
        shards *= 2
    while shards > 1 and 4 * peers < shard_records * shards:
        shards //= 2
    return shards


def summarizes(own_key: bytes, shard_keys: list[bytes], count: int = SUMMARIZERS) -> bool:
    """Whether the peer signing with ``own_key`` is among the ``count`` of ``shard_keys`` (the signing keys of
    its shard's records, its own included or not) whose hashes are lowest."""
    lowest = sorted({*shard_keys, own_key}, key=key_hash)[:count]
    return own_key in lowest


def summarize(records: dict, shards: int, shard: int, peer_id: bytes, now: float) -> dict:
    """The summary of one shard's believed records (signing key -> record, as hivemind stores them; an emptied
    record is left out), as stored under :func:`summary_key`: ``shards``, ``shard``, ``time``, ``peer_id`` (the
    summarizer's), ``peers``, and ``epochs``: ``[epoch, servers, clients, samples, speed, speed_time]`` for each
    epoch on record, ``speed_time`` being the sum of each record's time by its speed."""
    tallies: dict[int, list] = {}
    for record in records.values():
        if not isinstance(record, dict):
            continue
        tally = tallies.setdefault(record["epoch"], [record["epoch"], 0, 0, 0, 0.0, 0.0])
        tally[2 if record["client_mode"] else 1] += 1
        tally[3] += record["samples_accumulated"]
        tally[4] += record["samples_per_second"]
        tally[5] += record["time"] * record["samples_per_second"]
    epochs = sorted(tallies.values(), reverse=True)[:MAX_SUMMARY_EPOCHS]
    return {"shards": shards, "shard": shard, "time": now, "peer_id": peer_id,
            "peers": sum(tally[1] + tally[2] for tally in epochs), "epochs": epochs}


def pseudo_records(summary: dict, now: float) -> list[dict]:
    """One progress record for each epoch of a (believed) summary, which hivemind's estimate sums as it would
    the shard's records: the samples and speed of that epoch, dated so that ``samples + (now - time) x speed``
    is the shard's records' extrapolated samples; a client's record when no server is on that epoch."""
    made = []
    for epoch, servers, _clients, samples, speed, speed_time in summary["epochs"]:
        made.append({"peer_id": summary["peer_id"], "epoch": epoch, "samples_accumulated": int(samples),
                     "samples_per_second": float(speed), "time": float(speed_time / speed) if speed > 0 else now,
                     "client_mode": servers == 0})
    return made


def extrapolated(summary: dict, epoch: int, now: float) -> float:
    """A summary's samples on ``epoch``, each record's extrapolated at its speed since its time."""
    return sum(samples + now * speed - speed_time
               for on, _servers, _clients, samples, speed, speed_time in summary["epochs"] if on == epoch)


def well_formed(summary) -> bool:
    """Whether ``summary`` has every field of :func:`summarize` with a sane value."""
    if not isinstance(summary, dict):
        return False
    shards, shard, at, peers, epochs = (summary.get(field) for field in ("shards", "shard", "time", "peers", "epochs"))
    if type(shards) is not int or type(shard) is not int or type(peers) is not int or not isinstance(summary.get("peer_id"), bytes):
        return False
    if not 1 <= shards <= MAX_SHARDS or shards & (shards - 1) or not 0 <= shard < shards or peers < 1 or not isinstance(at, float) or not math.isfinite(at):
        return False
    if not isinstance(epochs, list) or not 0 < len(epochs) <= MAX_SUMMARY_EPOCHS:
        return False
    for tally in epochs:
        if not isinstance(tally, list) or len(tally) != 6 or any(type(value) is not int for value in tally[:4]) \
                or any(not isinstance(value, float) or not math.isfinite(value) for value in tally[4:]) \
                or min(tally[:5]) < 0:
            return False
    return sum(tally[1] + tally[2] for tally in epochs) == peers


@dataclasses.dataclass
class SummaryBelief:
    """What a reader believes of the summaries of the other shards: ``records`` (pseudo-records, one per shard
    and epoch, keyed by ``(shard, epoch)``), ``peers`` and ``clients`` (the peers those shards hold), and
    ``doubts`` (one line per summary, or epoch of one, left out or changed)."""

    records: dict
    peers: int
    clients: int
    doubts: list[str]


def believe_summaries(summaries: list[dict], shards: int, own_shard: int, own_records: list[dict], local_epoch: int,
                      target_batch_size: int, lifetime_s: float, now: float, banned=(), shard_records: int = SHARD_RECORDS
                      ) -> SummaryBelief:
    """The other shards' summaries a reader believes (see the module docstring).

    Args:
        summaries: every summary read (as :func:`summarize` makes them; anything else is left out).
        shards, own_shard: the reader's layout and shard; summaries of another layout or of its own shard are left out.
        own_records: the reader's own shard's records as it believed them (``progress_checks``), its own included.
        local_epoch: the reader's epoch.
        target_batch_size: the run's samples an epoch.
        lifetime_s: how long a record lives (hivemind's ``metadata_expiration``): an older summary is left out.
        now: the DHT time of the read.
        banned: peer ids (base58) whose summaries are left out.
        shard_records: the layout's records a shard; a summary of more than 4 times that many peers is left out.
    """

    doubts, by_shard = [], {}
    for summary in summaries:
        if not well_formed(summary):
            doubts.append("a summary not as summarize makes them: left out")
            continue
        if summary["shards"] != shards or summary["shard"] == own_shard:
            continue
        name = f"summary of shard {summary['shard']} by {(record_peer_id(summary) or '?')[-6:]}"
        if summary["time"] > now + CLOCK_SKEW_S or summary["time"] < now - lifetime_s - CLOCK_SKEW_S:
            doubts.append(f"{name} dated {now - summary['time']:.0f} s ago: left out")
        elif summary["peers"] > 4 * shard_records:
            doubts.append(f"{name} of {summary['peers']} peers: left out")
        elif record_peer_id(summary) in banned:
            doubts.append(f"{name} banned: left out")
        else:
            by_shard.setdefault(summary["shard"], []).append(summary)
    base = _swarms_epoch(by_shard, own_records, local_epoch)
    chosen = {}
    for shard, found in by_shard.items():
        found.sort(key=lambda summary: extrapolated(summary, base, now))
        chosen[shard] = found[(len(found) - 1) // 2]  # the median; of an even count the lower
    peers = sum(summary["peers"] for summary in chosen.values()) + len(own_records)
    per_peer_speeds = [record["samples_per_second"] for record in own_records] + \
        [sum(tally[4] for tally in summary["epochs"]) / summary["peers"] for summary in chosen.values()]
    per_peer_samples = [record["samples_accumulated"] for record in own_records if record["epoch"] == base] + \
        [tally[3] / (tally[1] + tally[2]) for summary in chosen.values() for tally in summary["epochs"] if tally[0] == base]
    speed_cap = SPEED_SLACK * statistics.median_high(per_peer_speeds) if per_peer_speeds else 0.0
    samples_cap = SPEED_SLACK * statistics.median_high(per_peer_samples) if per_peer_samples else 0.0
    records, clients = {}, 0
    for shard, summary in chosen.items():
        name = f"summary of shard {shard} by {(record_peer_id(summary) or '?')[-6:]}"
        for record, tally in zip(pseudo_records(summary, now), summary["epochs"]):
            count = tally[1] + tally[2]
            clients += tally[2]
            if record["epoch"] > base + 1:
                doubts.append(f"{name}: {count} peer(s) on epoch {record['epoch']}, the swarm on {base}: left out")
                continue
            most_samples = int(max(samples_cap, target_batch_size / max(peers, 1)) * count)
            most_speed = speed_cap * count
            if record["samples_accumulated"] > most_samples or record["samples_per_second"] > most_speed:
                doubts.append(f"{name}: {record['samples_accumulated']} samples at {record['samples_per_second']:.1f}/s "
                              f"on epoch {record['epoch']}: counted as at most {most_samples} at {most_speed:.1f}/s")
                speed = min(record["samples_per_second"], most_speed)
                # keep the extrapolation's time, so that the samples to come grow at the speed believed
                record = {**record, "samples_accumulated": min(record["samples_accumulated"], most_samples),
                          "samples_per_second": speed, "time": record["time"] if speed > 0 else now}
            records[(shard, record["epoch"])] = record
    _hold_back_one_ahead(records, own_records, base, target_batch_size, now, doubts)
    return SummaryBelief(records, peers - len(own_records), clients, doubts)


def _swarms_epoch(by_shard: dict, own_records: list[dict], local_epoch: int) -> int:
    """The swarm's epoch as the reader's own shard and the other shards' summaries show it: the highest epoch
    held by two sources (each record of its shard but its own, each summary's highest epoch with a server on
    it), else the second highest, else the only one, else the reader's own epoch."""
    held = [record["epoch"] for record in own_records if not record["client_mode"]]
    for found in by_shard.values():
        tops = [max((tally[0] for tally in summary["epochs"] if tally[1] > 0), default=None) for summary in found]
        tops = sorted(top for top in tops if top is not None)
        if tops:
            held.append(tops[(len(tops) - 1) // 2])
    counts = Counter(held)
    twice = [epoch for epoch, count in counts.items() if count >= 2]
    if twice:
        return max(max(twice), local_epoch)
    ordered = sorted(held, reverse=True)
    if len(ordered) >= 2:
        return max(ordered[1], local_epoch)
    return max(ordered[0], local_epoch) if ordered else local_epoch


def _hold_back_one_ahead(records: dict, own_records: list[dict], base: int, target_batch_size: int, now: float,
                         doubts: list[str]) -> None:
    """Read a summary's epoch one above the swarm's as a client's until the samples believed on the swarm's
    epoch (the reader's shard's records and the summaries', extrapolated) reach half the batch."""
    samples = sum(record["samples_accumulated"] + max(0.0, now - record["time"]) * record["samples_per_second"]
                  for record in [*own_records, *records.values()] if record["epoch"] == base)
    if 2 * samples >= target_batch_size:
        return
    for key, record in records.items():
        if record["epoch"] == base + 1 and not record["client_mode"]:
            doubts.append(f"shard {key[0]}'s epoch {record['epoch']} with {samples:.0f} samples on {base}: not followed yet")
            records[key] = {**record, "client_mode": True}


def followed_layout(summaries: list[dict], shards: int, peers_seen: int, now: float, lifetime_s: float) -> int:
    """The layout (number of shards) that holds the most peers, as a reader in ``shards`` that sees ``peers_seen``
    peers in it counts them (its own layout) and the fresh summaries of every other layout show them (the
    newest of each shard); of two that hold as many, the one with more shards. Every peer that reads the same
    counts takes the same layout, so a swarm split between layouts (peers that moved at different reads) joins
    up again."""
    newest: dict[tuple[int, int], dict] = {}
    for summary in summaries:
        if well_formed(summary) and summary["shards"] != shards and now - lifetime_s <= summary["time"] <= now + CLOCK_SKEW_S:
            place = (summary["shards"], summary["shard"])
            if place not in newest or newest[place]["time"] < summary["time"]:
                newest[place] = summary
    counts: Counter = Counter({shards: peers_seen})
    for (layout, _shard), summary in newest.items():
        counts[layout] += summary["peers"]
    return max(counts.items(), key=lambda item: (item[1], item[0]))[0]
