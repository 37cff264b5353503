"""Reading and publishing a run's records in the DHT: its manifest and every peer's metrics.

The formats are ``manifest.py`` and ``records.py`` (pydantic only); the checks a
peer applies to what others store are ``validators.py`` (this module first makes
the DHT follow the run, ``follow_run``). Records are signed under this peer's
own public key (``dht.own_public_key``), so only it can change its entry.
It imports hivemind (its validators do).
"""

from __future__ import annotations

import logging
import time

import pydantic

from p2ptrain.peers.net.dht import own_public_key
from p2ptrain.peers.net.local_reads import read_record, store_record
from p2ptrain.peers.swarm.manifest import MANIFEST_EXPIRATION_S, MANIFEST_FORMAT, Manifest, ManifestError, check_run_id, choose_manifest, manifest_key, parse_manifest
from p2ptrain.peers.swarm.records import METRICS_EXPIRATION_S, LocalMetrics, metrics_key, record_for_format
from p2ptrain.peers.swarm.validators import follow_run, owner_peer_id

logger = logging.getLogger(__name__)


def _peers_text(dht) -> str:
    peers = [str(peer) for peer in (getattr(dht, "initial_peers", None) or [])]
    return ", ".join(peers) if peers else "no bootstrap peers (this peer started alone)"


def read_manifests(dht, run_id: str) -> dict[str, Manifest]:
    """Every valid manifest currently published for ``run_id``, by publisher public key (as text).

    Records that fail the schema are logged and skipped (peers that know the
    run refuse them already; this guards against those that do not).
    """
    follow_run(dht, run_id)
    found = dht.get(manifest_key(run_id), latest=True)
    manifests: dict[str, Manifest] = {}
    if found is None or not isinstance(found.value, dict):
        return manifests
    for publisher, entry in found.value.items():
        publisher_text = publisher.decode(errors="replace") if isinstance(publisher, bytes) else str(publisher)
        try:
            manifest = parse_manifest(entry.value)
        except ManifestError as error:
            logger.warning("ignoring a manifest for run %s from %s: %s", run_id, publisher_text[:60], error)
            continue
        if manifest.run_id != run_id:
            logger.warning("ignoring a manifest for run %r stored under run %s", manifest.run_id, run_id)
            continue
        manifests[publisher_text] = manifest
    return manifests


def fetch_manifest(dht, run_id: str, timeout: float = 30.0) -> Manifest:
    """Read a run's manifest from the DHT, retrying until it is found or ``timeout`` seconds pass.

    :param dht: a running hivemind.DHT started by :func:`p2ptrain.peers.net.dht.start_dht`.
    :param run_id: the run to join.
    :param timeout: how long to keep looking; a peer that just joined may need a few seconds.
    :raises ManifestError: if no valid manifest was found in time.
    """
    check_run_id(run_id)
    deadline = time.monotonic() + timeout
    while True:
        manifests = read_manifests(dht, run_id)
        if manifests:
            break
        if time.monotonic() >= deadline:
            raise ManifestError(
                f"no run named {run_id!r} was found through {_peers_text(dht)}",
                "check the name and the bootstrap address",
            )
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    winner = choose_manifest(list(manifests.values()))
    losers = {manifest.manifest_hash() for manifest in manifests.values()} - {winner.manifest_hash()}
    if losers:
        logger.warning(
            "run %s has %d conflicting manifests; using the earliest (hash %s), ignoring %s",
            run_id,
            len(losers) + 1,
            winner.manifest_hash(),
            ", ".join(sorted(losers)),
        )
    return winner


def publish_manifest(dht, manifest: Manifest, expiration_s: float = MANIFEST_EXPIRATION_S) -> None:
    """Publish ``manifest`` under ``p2ptrain/{run_id}/manifest``, signed with this peer's key.

    The subkey is this peer's public key, so only this peer can change its
    own entry. Call it when creating a run, and again (with the manifest you
    fetched) from every peer that trains in it, so the run outlives its creator.

    :param expiration_s: how long the record lives unless republished.
    :raises ManifestError: if another peer already published a different,
        earlier manifest under this run id, or if the DHT refused the record.
    """
    from hivemind.utils import get_dht_time

    published = read_manifests(dht, manifest.run_id)
    ours = own_public_key(dht).decode()
    others = [other for key, other in published.items() if key != ours]
    if others:
        winner = choose_manifest(others + [manifest])
        if winner.manifest_hash() != manifest.manifest_hash():
            raise ManifestError(
                f"a run named {manifest.run_id!r} already exists with other settings (hash {winner.manifest_hash()})",
                "join it without a manifest, or pick another run id",
            )
    stored = dht.store(
        manifest_key(manifest.run_id),
        subkey=own_public_key(dht),
        value=manifest.model_dump(mode="json"),
        expiration_time=get_dht_time() + expiration_s,
    )
    if not stored:
        raise ManifestError(
            f"the DHT refused the manifest of run {manifest.run_id!r}",
            "check that this peer reaches its bootstrap peers, then retry",
        )



def publish_metrics(dht, run_id: str, metrics: LocalMetrics, manifest_format: int = MANIFEST_FORMAT,
                    expiration_s: float = METRICS_EXPIRATION_S, place: tuple[int, int] = (1, 0)) -> bool:
    """Publish this peer's metrics for ``run_id``, signed under its own public key.

    :param manifest_format: the run's manifest format: the record holds only the fields
        its peers know (``records.record_for_format``).
    :param expiration_s: the record vanishes after this many seconds unless
        republished; publish at least twice per period to stay visible.
    :param place: this peer's shard of the run's records, ``(shards, shard)`` (``progress_shards``;
        ``QuietProgressTracker.place``): its record goes under that shard's key.
    :returns: whether the DHT accepted the record (False e.g. when no peer
        answered; the next publish retries, so callers usually just log it).
    """
    from hivemind.utils import get_dht_time

    follow_run(dht, run_id)
    stored = store_record(dht, metrics_key(run_id, *place), own_public_key(dht), record_for_format(metrics, manifest_format),
                          get_dht_time() + expiration_s)
    if not stored:
        logger.warning("the DHT did not accept this peer's metrics for run %s", run_id)
    return bool(stored)


def withdraw_metrics(dht, run_id: str, expiration_s: float = METRICS_EXPIRATION_S, place: tuple[int, int] = (1, 0)) -> bool:
    """Say goodbye: replace this peer's metrics with an empty entry, so readers drop it at once.

    A record with a *shorter* life cannot replace ours (the DHT keeps the entry
    that expires last), so an empty entry that outlives the last published
    record is stored instead; ``expiration_s`` must be at least the one used
    by :func:`publish_metrics`; ``place`` the shard it was published in.

    :returns: whether the DHT accepted it.
    """
    from hivemind.utils import get_dht_time

    follow_run(dht, run_id)
    stored = store_record(dht, metrics_key(run_id, *place), own_public_key(dht), None, get_dht_time() + expiration_s)
    return bool(stored)


def read_metrics(dht, run_id: str, max_age_s: float = 0.0, shards: int = 1, shard: int | None = 0) -> list[LocalMetrics]:
    """Every peer's current metrics for ``run_id`` in shard ``shard`` of ``shards`` (None: in every shard, as an
    observer outside the swarm reads them): from this peer's own copy once it holds every record, else the
    newest state the DHT's nodes have (``local_reads.read_record``; ``max_age_s``: what a holder answered this
    recently is fresh enough, as there).

    Records that fail the schema, or whose ``peer_id`` is not the one of the
    key they are signed with, are logged and dropped. Signatures are checked
    when a record reaches this peer (the OwnerSignatureValidator that
    :func:`p2ptrain.peers.net.dht.start_dht` installs), so no record under another
    peer's key without its signature gets here; the other checks are repeated
    here because this peer's own storage may hold records it accepted before
    it followed the run.
    """
    from hivemind.dht.protocol import DHTProtocol

    follow_run(dht, run_id)
    if shard is None:
        reads = [read_record(dht, metrics_key(run_id, shards, index), return_future=True, max_age_s=max_age_s)
                 for index in range(shards)]
        found = [read.result() for read in reads]
    else:
        found = [read_record(dht, metrics_key(run_id, shards, shard), max_age_s=max_age_s)]
    entries = [item for each in found if each is not None and isinstance(each.value, dict) for item in each.value.items()]
    peers = []
    for subkey, entry in entries:
        if entry.value is None:
            continue
        try:
            metrics = LocalMetrics.model_validate(entry.value, strict=True)
        except pydantic.ValidationError as error:
            logger.warning("dropped a metrics record of run %s: %s", run_id, str(error).replace("\n", " "))
            continue
        signer = owner_peer_id(DHTProtocol.serializer.dumps(subkey))
        if signer != metrics.peer_id:
            logger.warning(
                "dropped a metrics record of run %s claiming peer %s, signed by %s", run_id, metrics.peer_id, signer
            )
            continue
        peers.append(metrics)
    return sorted(peers, key=lambda metrics: metrics.peer_id)
