"""hivemind's ProgressTracker with a traffic budget: fewer progress records written and read.

Measured in the network lab (4 peers, ``benchmarks/RESULTS.md``), hivemind's
defaults make progress records the largest part of a peer's background
traffic:

- every local step stores a signed progress record in the DHT (several nodes
  each, ~1 store a second per peer while training);
- every peer reads the whole swarm's records as often as every 0.5 s when it
  expects the epoch to end soon, and a paused swarm keeps expecting that (its
  records still carry the speeds from before the pause), so paused peers read
  twice a second forever.

``QuietProgressTracker`` asks for a store at most every ``report_period``
seconds (and at once when the local epoch changes), but hivemind's reporter
thread stores once woken, so the take-back holds only while a store is in
flight: in practice records are still stored about once a step. That freshness
is what DiLoCo rounds on the swarm's samples need: stricter paces (every 10 s,
every 2 s, every step only near the epoch end) let a slow peer's used share in
``tests/integration/test_slow_peer.py`` fall below 80 % (``benchmarks/RESULTS.md``).
It reads at most every ``min_refresh_period`` seconds, so an epoch's end is
seen up to ``min_refresh_period`` seconds late. Its reads come from the peer's
own copy of the records where that copy is complete (``local_reads``: in runs
of up to five serving peers, after the first minute), so most of them send
nothing.
(A paused peer reads nothing: its worker has left the swarm.)

After each epoch update it reads the swarm's records at once (``update_epoch``):
hivemind checks once an epoch, at the first read after the update, that this
peer is on the swarm's epoch exactly, and downloads the state if not. Left to
its schedule, that first read could come as late as the next epoch's end; once
a peer's reads fell there (a peer that had just joined again, in the 8-peer
lab), the peers that reduce had already moved on at each check, and it
downloaded the state instead of averaging every other round.

Every reader estimates the epoch's end from the records (each one's samples
extrapolated at its speed from its time), and sync rounds are pre-scheduled
from that estimate; a group forms when its time comes, closed to peers that
arrive later. So the speeds must be true: samples put back from a checkpoint,
and a worker's first step (no rest before it), are not timed
(``report_restored_samples``, ``report_local_progress``), and a stopping
tracker waits for the goodbye that removes its record (``shutdown``). And the
other peers' records are checked before they are believed: a hostile peer's
record could otherwise stop the swarm or make it step at every local step
(``progress_checks``).

Past ``progress_shards.SHARD_RECORDS`` peers the records are kept in shards,
and each shard's summary stands for its records at the readers of the other
shards (``progress_shards``): a read carries about N / S + 2 S entries, not N.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Collection

from hivemind.optim.progress_tracker import ProgressTracker
from hivemind.p2p import PeerID
from hivemind.utils import ValueWithExpiration, get_dht_time

from p2ptrain.peers.net.local_reads import LocalFirstDHT, read_records, store_record
from p2ptrain.peers.swarm import progress_shards as shards_of_records
from p2ptrain.peers.swarm.progress_checks import ProgressChecks
from p2ptrain.peers.training.settings import start_round_log

logger = logging.getLogger(__name__)

REPORT_PERIOD_S = 10.0
# the most seconds a stopping tracker waits for its goodbye (its record replaced by an empty one) to be stored
GOODBYE_STORE_TIMEOUT_S = 3.0
MIN_REFRESH_PERIOD_S = 2.0
MAX_REFRESH_PERIOD_S = 30.0


class QuietProgressTracker(ProgressTracker):
    """A ProgressTracker that writes and reads progress records less often (see the module docstring).

    Args:
        dht: the peer's DHT; progress is read through ``local_reads.LocalFirstDHT``.
        report_period: seconds between stores of this peer's progress within one epoch.
        banned: peer ids (base58) whose records are not believed (``Trust.banned``: read at each read).
        shard_records: the most records a shard of the progress records is meant to hold
            (``progress_shards.SHARD_RECORDS``; labs set fewer, to see shards with a few peers).
        **kwargs: hivemind's ProgressTracker arguments; ``min_refresh_period`` and
            ``max_refresh_period`` default to 2 and 30 seconds (hivemind: 0.5 and 10).
    """

    def __init__(self, dht, *args, report_period: float = REPORT_PERIOD_S, banned: Collection[str] = (),
                 shard_records: int = shards_of_records.SHARD_RECORDS, **kwargs):
        kwargs.setdefault("min_refresh_period", MIN_REFRESH_PERIOD_S)
        kwargs.setdefault("max_refresh_period", MAX_REFRESH_PERIOD_S)
        self.report_period = report_period
        self.log_records = start_round_log()
        self._first_rise_untimed = False  # whether a rise in samples was left untimed (``report_local_progress``)
        self._last_trigger = -float("inf")
        self._banned = banned
        self._checks: ProgressChecks | None = None  # made at the first read (hivemind's __init__ sets what it needs)
        self.shard_records = shard_records
        self.shards = 1  # the layout this peer reads and stores in (``progress_shards``)
        self._summaries: list[dict] = []  # the shards' summaries at the last read of them
        self._summaries_read_at = -float("inf")  # monotonic
        self._summary_stored_at = -float("inf")  # monotonic
        self._moved_at = -float("inf")  # monotonic: when this peer last moved to another layout
        super().__init__(_ProgressDHT(dht, self), *args, **kwargs)

    other_peers = 0  # set by every look at the swarm's records (the first one in hivemind's __init__)
    # what the last read carried: the records of this peer's shard (goodbyes not counted), and the shards'
    # summaries (None: not read)
    last_read_entries: tuple[int, int | None] = (0, None)

    def place(self) -> tuple[int, int]:
        """This peer's shard of the run's records, ``(shards, shard)``: its metrics records go there too."""
        return self.shards, shards_of_records.shard_of(self._local_public_key, self.shards)

    @property
    def _base_key(self) -> str:
        """hivemind's progress key (a layout of one shard); the shards' keys and the summaries' derive from it."""
        return f"{self.prefix}_progress"

    def keys_to_read(self, key: str) -> list[str]:
        """What a read of ``key`` (this peer's shard) asks for: with the shards' summaries at its first read, then
        every ``SUMMARIES_READ_SHARE`` of a record's lifetime in shards and every ``LAYOUT_CHECK_S`` in one
        (``progress_shards``); the summaries read last count in between."""
        every = (self.metadata_expiration * shards_of_records.SUMMARIES_READ_SHARE if self.shards > 1
                 else shards_of_records.LAYOUT_CHECK_S)
        if time.monotonic() - self._summaries_read_at >= every:
            return [key, shards_of_records.summary_key(self._base_key)]
        return [key]

    @property
    def alone(self) -> bool:
        """Whether the last look at the swarm's progress records found no other peer's.

        hivemind's ``num_peers`` counts this peer's own record too, once it is stored: a peer that
        has just joined sees one record, someone else's, and ``num_peers <= 1`` took it for alone
        (in the network lab three volunteers joining a DiLoCo run each took an outer step on their
        own a second after downloading the swarm's state, and ran ahead of the creator for good)."""
        return self.other_peers == 0

    def _parse_swarm_progress_data(self, metadata):
        """hivemind's, on the records ``progress_checks`` believes of this peer's shard and the summaries
        ``progress_shards`` believes of the others, counting the peers other than this one (:attr:`alone`);
        moves to another layout of shards when the peers seen call for it. Under the round log
        (``settings.ROUND_LOG_VARIABLE``) it also logs the records it read and what it doubted of them."""
        now = get_dht_time()
        summaries_read = None
        if isinstance(metadata, list):  # this peer's shard, and the summaries when they were read
            if len(metadata) > 1:
                found = metadata[1].value if metadata[1] is not None else None
                self._summaries = [entry.value for entry in (found.values() if isinstance(found, dict) else ())
                                   if entry.value is not None]
                self._summaries_read_at, summaries_read = time.monotonic(), len(self._summaries)
            metadata = metadata[0].value if metadata[0] is not None else None
        self.last_read_entries = (sum(isinstance(entry.value, dict) for entry in metadata.values())
                                  if isinstance(metadata, dict) else 0, summaries_read)
        doubts = []
        if isinstance(metadata, dict):
            if self._checks is None:
                self._checks = ProgressChecks(self.target_batch_size, self.metadata_expiration, self._banned)
            ema = self.performance_ema
            belief = self._checks.believe({key: entry.value for key, entry in metadata.items()}, self._local_public_key,
                                          ema.samples_per_second if ema.num_updates else None, now)
            metadata = {key: ValueWithExpiration(value, metadata[key].expiration_time)
                        for key, value in belief.records.items()}
            doubts += belief.doubts
        records = {key: entry.value for key, entry in (metadata.items() if isinstance(metadata, dict) else ())
                   if isinstance(entry.value, dict)}
        own_shard = shards_of_records.shard_of(self._local_public_key, self.shards)
        summaries = shards_of_records.believe_summaries(
            self._summaries, self.shards, own_shard, list(records.values()), self.local_progress.epoch,
            self.target_batch_size, self.metadata_expiration, now, self._banned, self.shard_records)
        doubts += summaries.doubts
        self.other_peers = sum(1 for key in records if key != self._local_public_key) + summaries.peers
        if self.log_records:
            logger.info("progress records read: %s", describe_records(list(records.values()), now))
            if doubts:
                logger.info("progress records doubted: %s", "; ".join(doubts))
        if summaries.records:
            expiration = now + self.metadata_expiration
            metadata = {**(metadata if isinstance(metadata, dict) else {}),
                        **{("summary", *place): ValueWithExpiration(record, expiration) for place, record in summaries.records.items()}}
        progress = super()._parse_swarm_progress_data(metadata)
        if summaries.records:
            progress = dataclasses.replace(progress, num_peers=len(records) + summaries.peers,
                                           num_clients=sum(record["client_mode"] for record in records.values()) + summaries.clients)
        self._summarize(records, own_shard, now, progress)
        self._follow_the_layout(len(records) + summaries.peers, now, progress)
        return progress

    def _summarize(self, records: dict, own_shard: int, now: float, progress) -> None:
        """Store this peer's shard's summary (its records as believed, this peer's own as it stands now) when it
        is one of its shard's summarizers: at most every ``SUMMARY_PERIOD_S`` in shards, every ``LAYOUT_CHECK_S``
        in one (for the peers in shards to see this layout); a peer that stops being one replaces its summary
        with an empty one. A summarizer in shards reads (and so summarizes)
        at least three times in a record's lifetime, whatever the epoch's end it expects: its summary must not
        expire between two."""
        if not shards_of_records.summarizes(self._local_public_key, list(records)):
            if self._summary_stored_at > -float("inf"):  # it was one (a peer with a lower hash came): its goodbye
                self._summary_stored_at = -float("inf")
                store_record(self.dht, shards_of_records.summary_key(self._base_key), self._local_public_key, None,
                             now + self.metadata_expiration, return_future=True)
            return
        if self.shards > 1:
            progress.next_fetch_time = min(progress.next_fetch_time, now + self.metadata_expiration / 3)
        period = shards_of_records.SUMMARY_PERIOD_S if self.shards > 1 else shards_of_records.LAYOUT_CHECK_S
        if time.monotonic() - self._summary_stored_at < period:
            return
        own = self.local_progress.dict()
        summary = shards_of_records.summarize({**records, self._local_public_key: own}, self.shards, own_shard,
                                              own["peer_id"], now)
        self._summary_stored_at = time.monotonic()
        store_record(self.dht, shards_of_records.summary_key(self._base_key), self._local_public_key, summary,
                     now + self.metadata_expiration, return_future=True)

    def _follow_the_layout(self, peers_seen: int, now: float, progress) -> None:
        """Move this peer's record to the layout of shards the peers seen call for (``progress_shards``): its
        record's goodbye in the old key (and its summary's), its record stored in the new one soon, and the
        next read, with the summaries, soon after."""
        layout = shards_of_records.followed_layout(self._summaries, self.shards, peers_seen, now, self.metadata_expiration)
        if layout == self.shards:
            layout = shards_of_records.shards_for(peers_seen, self.shards, self.shard_records)
        if layout == self.shards:
            return
        old_key = self.training_progress_key
        self.shards, self._moved_at = layout, time.monotonic()
        self.training_progress_key = shards_of_records.shard_key(
            self._base_key, layout, shards_of_records.shard_of(self._local_public_key, layout))
        logger.info("Progress records: %d peer(s) seen, now in %d shard(s); this peer's under %s",
                    peers_seen, layout, self.training_progress_key)
        for key in (old_key, shards_of_records.summary_key(self._base_key)):
            store_record(self.dht, key, self._local_public_key, None, now + self.metadata_expiration, return_future=True)
        self._summary_stored_at = self._summaries_read_at = -float("inf")  # the new layout's summaries at the next read
        progress.next_fetch_time = min(progress.next_fetch_time, now + self.min_refresh_period)
        if hasattr(self, "should_report_progress"):  # not before hivemind's __init__ made it (its first read)
            self.should_report_progress.set()

    def report_local_progress(self, local_epoch: int, samples_accumulated: int, update_global_samples: bool = True):
        """hivemind's, with two changes.

        The first rise in samples after the tracker started is not timed: hivemind takes the seconds
        since it started (or since the last epoch change) for the samples' work, but a worker rests
        after each step (``policy.max_compute_share``), not before its first, so that interval held
        no rest. In the 16-peer lab at a share of 0.12 a returning peer's first records said 15-42
        samples/s, 5-13 times its speed, and with a few returns at once every reader expected the
        epoch's end 14-27 s early. The next rise is timed from this one.

        The store it asked for is taken back unless the epoch changed or ``report_period`` passed
        (the take-back holds only while the reporter is busy with a store: see the module docstring).
        """
        new_epoch = local_epoch != self.local_progress.epoch
        if not self._first_rise_untimed and samples_accumulated > self.local_progress.samples_accumulated:
            self._first_rise_untimed = True
            self._report_untimed(local_epoch, samples_accumulated, update_global_samples)
        else:
            super().report_local_progress(local_epoch, samples_accumulated, update_global_samples)
        now = time.monotonic()
        if new_epoch or now - self._last_trigger >= self.report_period:
            self._last_trigger = now
        else:
            # super() asked the reporter thread to store now; take it back (it usually stored already)
            self.should_report_progress.clear()

    def report_restored_samples(self, local_epoch: int, samples_accumulated: int) -> None:
        """``report_local_progress`` for samples that were not trained just now (gradients put back from a
        checkpoint, or kept over a download), which must not count toward this peer's speed.

        hivemind takes any rise in the samples reported for work done since the last report, and a
        restart's restore comes milliseconds after the download's report: in the 16-peer lab a
        returning peer's first record said thousands of samples a second, every reader's estimate
        of the epoch's end fell to seconds, the swarm's groups formed that early, and a peer
        returning meanwhile found no group until the next epoch."""
        self._report_untimed(local_epoch, samples_accumulated)

    def _report_untimed(self, local_epoch: int, samples_accumulated: int, update_global_samples: bool = True) -> None:
        """hivemind's ``report_local_progress`` without measuring a speed from it; the next report is timed
        from now."""
        ema = self.performance_ema
        speed = ema.ema_seconds_per_sample, ema.num_updates, ema.samples_per_second
        super().report_local_progress(local_epoch, samples_accumulated, update_global_samples)
        ema.ema_seconds_per_sample, ema.num_updates, ema.samples_per_second = speed
        ema.reset_timer()
        self.local_progress = self._get_local_progress(local_epoch, samples_accumulated)

    def update_epoch(self, new_epoch: int | None = None) -> int:
        """hivemind's, then a read of the swarm's records at once, early in the new epoch (see the
        module docstring); returns the new epoch."""
        epoch = super().update_epoch(new_epoch)
        self.global_progress.next_fetch_time = get_dht_time()
        self.global_state_updated.set()  # wakes the fetcher, which then finds its next read due now
        return epoch

    def shutdown(self, timeout: float | None = None) -> None:
        """hivemind's: stop reporting and reading, then replace this peer's record with an empty one,
        which readers drop at once; here the store is waited for (up to ``GOODBYE_STORE_TIMEOUT_S``).

        hivemind sends that goodbye and returns, and the worker shuts its DHT down right after: in
        the 16-peer lab a peer's record was still read 16-34 s after its ``leave`` had ended, until
        it expired. Such a record counts in the swarm's speed and, while on the swarm's epoch, its
        samples are extrapolated at its last speed: readers expect the epoch to end too early."""
        self.shutdown_triggered.set()
        self.should_report_progress.set()
        self.global_state_updated.set()
        self.shutdown_complete.wait(timeout)
        keys = [self.training_progress_key, shards_of_records.summary_key(self._base_key)]
        goodbyes = [self.dht.store(key, subkey=self._local_public_key, value=None,
                                   expiration_time=get_dht_time() + self.metadata_expiration, return_future=True)
                    for key in keys]
        try:
            for goodbye in goodbyes:
                goodbye.result(GOODBYE_STORE_TIMEOUT_S)
        except Exception as error:  # the DHT failed or the holders did not answer: the record expires on its own
            logger.info("Progress goodbye not stored: %r", error)


def describe_records(entries: list[dict], now: float) -> str:
    """One line for the round log: each progress record as ``<peer id's last 6> e<epoch> <samples> @<age> s
    <samples/s>/s``, oldest first (a record's samples are extrapolated at its speed from its time)."""
    def line(entry: dict) -> str:
        try:
            peer = PeerID(entry.get("peer_id")).to_base58()[-6:]
        except (TypeError, ValueError):  # a record from a peer that does not follow the schema
            peer = "?"
        return (f"{peer} e{entry.get('epoch')} {entry.get('samples_accumulated')} @{now - entry.get('time', now):.0f} s "
                f"{entry.get('samples_per_second', 0.0):.1f}/s{' client' if entry.get('client_mode') else ''}")
    return "; ".join(line(entry) for entry in sorted(entries, key=lambda entry: entry.get("time", now)))


class _ProgressDHT(LocalFirstDHT):
    """The tracker's DHT: a ``LocalFirstDHT`` whose reads of the progress records also read the shards'
    summaries when the tracker wants them (:meth:`QuietProgressTracker.keys_to_read`); such a read's value
    is the list of what each key's read found."""

    def __init__(self, dht, tracker: QuietProgressTracker):
        super().__init__(dht)
        self._tracker = tracker

    def get(self, key, latest: bool = False, return_future: bool = False):
        return read_records(self._dht, self._tracker.keys_to_read(key), return_future=return_future)
