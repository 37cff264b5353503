"""The metric families of a run and of its peers, shared by the daemon's and the run monitor's ``/metrics``.

A run's numbers are the ``run`` object of ``status`` (``id``, ``mode``,
``model``, ``manifest_hash``, ``epoch``, ``samples_accumulated``,
``target_batch_size``, ``eta_next_epoch_s``, ``num_peers``, ``last_epoch_at``;
the monitor adds ``samples_per_second``), a peer's are a ``PeerRow`` as a dict
(``control_types.PeerRow``): the same names whoever serves them, so one
dashboard reads both. Every sample carries ``run`` (and ``peer``, the peer
id); the rest of a peer's description is in ``p2ptrain_peer_info``.
"""

from __future__ import annotations

from p2ptrain.openmetrics import OpenMetricsText


def add_run(text: OpenMetricsText, run: dict) -> None:
    """The run's families, from a ``status.run``-shaped dict (keys it lacks are left out)."""
    labels = {"run": run["id"]}
    text.add("p2ptrain_run", "info", "the run's settings, from its manifest", 1, **labels,
             mode=run.get("mode"), model=run.get("model"), manifest_hash=run.get("manifest_hash"))
    text.add("p2ptrain_run_epoch", "gauge", "the swarm's epoch: averaging rounds completed", run.get("epoch"), **labels)
    text.add("p2ptrain_run_samples_accumulated", "gauge", "samples the swarm trained towards the next epoch",
             run.get("samples_accumulated"), **labels)
    text.add("p2ptrain_run_target_batch_size", "gauge", "samples that complete an epoch", run.get("target_batch_size"), **labels)
    text.add("p2ptrain_run_peers", "gauge", "peers with the run's manifest seen in the swarm", run.get("num_peers"), **labels)
    text.add("p2ptrain_run_samples_per_second", "gauge", "the compatible peers' training speeds, summed",
             run.get("samples_per_second"), **labels)
    text.add("p2ptrain_run_eta_next_epoch_seconds", "gauge", "estimated seconds until the next epoch",
             run.get("eta_next_epoch_s"), **labels)
    text.add("p2ptrain_run_last_epoch_timestamp_seconds", "gauge", "when the last epoch ended (Unix time)",
             run.get("last_epoch_at"), **labels)


def add_peers(text: OpenMetricsText, run_id: str, peers: list[dict]) -> None:
    """A peer's families for each ``PeerRow``-shaped dict in ``peers``."""
    for peer in peers:
        labels = {"run": run_id, "peer": peer["peer_id"]}
        text.add("p2ptrain_peer", "info", "a peer of the run, as its signed metrics record describes it", 1, **labels,
                 nickname=peer.get("nickname"), device=peer.get("device"), precision=peer.get("precision"),
                 quantization=peer.get("quantization"), reachability=peer.get("reachability"),
                 version=peer.get("version"), compatible="true" if peer.get("compatible", True) else "false")
        text.add("p2ptrain_peer_samples_per_second", "gauge", "the peer's recent training speed",
                 peer.get("samples_per_second"), **labels)
        text.add("p2ptrain_peer_loss", "gauge", "the peer's latest training loss", peer.get("loss"), **labels)
        text.add("p2ptrain_peer_epoch", "gauge", "the peer's local epoch", peer.get("epoch"), **labels)
        text.add("p2ptrain_peer_micro_batch", "gauge", "samples per forward pass on the peer", peer.get("micro_batch"), **labels)
        text.add("p2ptrain_peer_trained_samples", "counter", "samples the peer trained in the run",
                 peer.get("trained_samples"), **labels)
        text.add("p2ptrain_peer_contributed_samples", "counter",
                 "samples of the peer that entered an adopted average or optimizer step", peer.get("contributed_samples"), **labels)
        text.add("p2ptrain_peer_last_group_size", "gauge", "peers in the peer's last averaging round, itself included",
                 peer.get("last_group") or None, **labels)
        text.add("p2ptrain_peer_bans", "gauge", "peers this peer refuses to average with", len(peer.get("bans") or ()), **labels)
        text.add("p2ptrain_peer_last_seen_timestamp_seconds", "gauge", "when the peer last published its record (Unix time)",
                 peer.get("last_seen"), **labels)
