"""The swarm view: where the run stands and who is in it, from two kinds of DHT records.

- hivemind's progress records (``{prefix}_progress``, written by the
  ProgressTracker that hivemind.Optimizer runs, or that the DiLoCo worker runs
  itself), under the averaging prefix of our manifest: they say how many
  samples compatible peers have accumulated towards the next epoch;
- our metrics records (``{run_id}_metrics``, :mod:`p2ptrain.peers.swarm.records`),
  under the plain run id: they describe every peer, compatible or not.

Past ``progress_shards.SHARD_RECORDS`` peers the progress records are in
shards: the view then counts the shards' summaries (it reads no shard), and
lists the peers of the reader's own shard of the metrics records (an observer:
of every shard).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from p2ptrain.peers.net.local_reads import read_record
from p2ptrain.peers.swarm import progress_shards
from p2ptrain.peers.swarm.manifest import averaging_prefix_for
from p2ptrain.peers.swarm.records import LocalMetrics
from p2ptrain.peers.swarm.run_records import read_metrics
from p2ptrain.worker_pipe import PeerRow, Swarm

logger = logging.getLogger(__name__)

# a read of the swarm's records that a holder answered this recently is what the view shows, without
# asking again: the ProgressTracker reads progress every 2-30 s, and metrics records change every 30 s
RECENT_READ_S = 30.0
# how long a progress record or summary lives (hivemind's metadata_expiration, as the workers' trackers keep it)
RECORD_LIFETIME_S = 60.0


@dataclass
class _Progress:
    peer_id: str
    epoch: int
    samples_accumulated: int
    samples_per_second: float
    time: float
    client_mode: bool


def _read_progress(dht, prefix: str) -> list[_Progress]:
    from hivemind.p2p import PeerID

    found = read_record(dht, f"{prefix}_progress", max_age_s=RECENT_READ_S)
    if found is None or not isinstance(found.value, dict):
        return []
    progress = []
    for entry in found.value.values():
        value = entry.value
        if value is None:  # a peer that left
            continue
        try:
            progress.append(
                _Progress(
                    peer_id=PeerID(value["peer_id"]).to_base58(),
                    epoch=int(value["epoch"]),
                    samples_accumulated=int(value["samples_accumulated"]),
                    samples_per_second=float(value["samples_per_second"]),
                    time=float(value["time"]),
                    client_mode=bool(value["client_mode"]),
                )
            )
        except (KeyError, TypeError, ValueError) as error:
            logger.warning("dropped a progress record under %s: %r", prefix, error)
    return progress


def _read_shards(dht, prefix: str, peers_seen: int, target_batch_size: int, now: float) -> tuple[list[_Progress], int, int]:
    """When the run's progress records are in shards (``progress_shards``), what the shards' summaries say: one
    entry per shard and epoch (with no peer id), the peers they count, and the number of shards; else nothing,
    and one shard."""
    found = read_record(dht, progress_shards.summary_key(f"{prefix}_progress"), max_age_s=RECENT_READ_S)
    summaries = [entry.value for entry in (found.value.values() if found is not None and isinstance(found.value, dict) else ())
                 if entry.value is not None]
    layout = progress_shards.followed_layout(summaries, 1, peers_seen, now, RECORD_LIFETIME_S)
    if layout == 1:
        return [], 0, 1
    belief = progress_shards.believe_summaries(summaries, layout, -1, [], 0, target_batch_size, RECORD_LIFETIME_S, now)
    entries = [_Progress(peer_id="", epoch=record["epoch"], samples_accumulated=record["samples_accumulated"],
                         samples_per_second=record["samples_per_second"], time=record["time"],
                         client_mode=record["client_mode"]) for record in belief.records.values()]
    return entries, belief.peers, layout


def _peer_row(metrics: LocalMetrics, compatible: bool, is_local: bool) -> PeerRow:
    """The row of a peer that publishes metrics: its record, seen at the record's time."""
    return PeerRow(**metrics.model_dump(exclude={"time"}), compatible=compatible, last_seen=metrics.time, is_local=is_local)


def read_swarm(
    dht, run_id: str, manifest_hash: str, target_batch_size: int, progress_prefix: str | None = None,
    place: tuple[int, int] | None = None,
) -> Swarm:
    """Read the run's progress and peers from the DHT, as the ``Swarm`` report the worker sends.

    ``epoch`` is the swarm's epoch (the highest among compatible peers that
    serve the DHT), ``samples_accumulated`` the samples contributed towards it
    so far, ``eta_next_epoch_s`` the estimated seconds until it completes (None
    while nobody reports a speed), ``num_peers`` the compatible peers seen, and
    ``peers`` one ``PeerRow`` per peer seen, incompatible ones included with
    ``compatible=False``.

    :param run_id: the run; its metrics records are under ``{run_id}_metrics``.
    :param manifest_hash: our manifest's hash: peers publishing another one are
        incompatible, and progress is read under ``averaging_prefix_for(run_id, manifest_hash)``.
    :param target_batch_size: samples per epoch, from the manifest.
    :param progress_prefix: read hivemind's progress under this prefix instead
        (only if the worker gave hivemind another run id than the averaging prefix).
    :param place: the reader's shard of the run's records, ``(shards, shard)`` (a training peer's
        ``QuietProgressTracker.place``): ``peers`` then lists the peers of its shard (past 32 peers, not
        all of them; ``num_peers`` counts all). None: an observer outside the swarm (``p2ptrain monitor``),
        which reads every shard's metrics.
    """
    from hivemind.utils import get_dht_time

    now = get_dht_time()
    prefix = progress_prefix or averaging_prefix_for(run_id, manifest_hash)
    progress = _read_progress(dht, prefix)
    summed, summed_peers, shards = _read_shards(dht, prefix, len(progress), target_batch_size, now)
    if shards > 1:  # what is left under hivemind's key is peers moving to the shards (or a remembered answer)
        progress = []
    if place is not None:
        metrics = read_metrics(dht, run_id, RECENT_READ_S, *place)
    else:
        metrics = read_metrics(dht, run_id, RECENT_READ_S, shards, None)
    own_peer_id = dht.peer_id.to_base58()

    counted = progress or summed  # the records of a swarm in one shard, or the shards' summaries
    servers = [entry for entry in counted if not entry.client_mode] or counted
    compatible_metrics = [row for row in metrics if row.manifest_hash == manifest_hash]
    if servers:
        epoch = max(entry.epoch for entry in servers)
    else:
        epoch = max((row.epoch for row in compatible_metrics), default=0)

    samples_accumulated = sum(entry.samples_accumulated for entry in counted if entry.epoch == epoch)
    # As hivemind's ProgressTracker does: peers keep working since they last reported.
    estimated_samples = sum(
        entry.samples_accumulated + max(0.0, now - entry.time) * entry.samples_per_second
        for entry in counted
        if entry.epoch == epoch
    )
    total_speed = sum(entry.samples_per_second for entry in counted)
    eta = max(0.0, target_batch_size - estimated_samples) / total_speed if total_speed > 0 else None

    rows = [_peer_row(row, row.manifest_hash == manifest_hash, row.peer_id == own_peer_id) for row in metrics]
    described = {row.peer_id for row in metrics}
    for entry in progress:
        if entry.peer_id in described:
            continue
        # A compatible peer that reports progress but no metrics (e.g. a plain hivemind peer).
        described.add(entry.peer_id)
        rows.append(
            PeerRow(
                peer_id=entry.peer_id,
                nickname="",
                samples_per_second=entry.samples_per_second,
                epoch=entry.epoch,
                manifest_hash=manifest_hash,
                compatible=True,
                reachability="unknown",
                last_seen=entry.time,
                is_local=entry.peer_id == own_peer_id,
            )
        )
    compatible_ids = {row.peer_id for row in rows if row.compatible}
    return Swarm(
        epoch=epoch,
        samples_accumulated=samples_accumulated,
        target_batch_size=target_batch_size,
        eta_next_epoch_s=eta,
        num_peers=max(len(compatible_ids), summed_peers),
        peers=rows,
    )
