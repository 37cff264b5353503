"""What the daemon knows of the run it is in, built from the worker's reports.

The worker reports ``joined`` (who we are in the swarm), ``step`` (local
progress), ``epoch`` (an averaging round is done) and ``swarm`` (the global
progress and the other peers). This module keeps the latest of each and
shapes the ``run``, ``local`` and ``peers`` parts of the control protocol.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

LOCAL_FIELDS = (
    "peer_id",
    "nickname",
    "addresses",
    "reachability",
    "device",
    "precision",
    "quantization",
    "micro_batch",
    "grad_accum",
    "parameters",
    "trainable_parameters",
)
PEER_FIELDS = (
    "peer_id",
    "nickname",
    "device",
    "precision",
    "quantization",
    "micro_batch",
    "samples_per_second",
    "loss",
    "epoch",
    "contributed_samples",
    "manifest_hash",
    "compatible",
    "reachability",
    "version",
    "last_seen",
)


@dataclass
class RunView:
    """The latest reported state of one run, as seen from this peer."""

    run_id: str | None = None
    joined: bool = False
    manifest: dict[str, Any] = field(default_factory=dict)
    manifest_hash: str | None = None
    local: dict[str, Any] = field(default_factory=dict)
    epoch: int = 0
    samples_accumulated: int = 0
    target_batch_size: int | None = None
    eta_next_epoch_s: float | None = None
    num_peers: int = 0
    samples_per_second: float | None = None
    loss: float | None = None
    contributed_samples: int = 0
    last_epoch_at: float | None = None
    peers: list[dict] = field(default_factory=list)
    warnings: list[dict] = field(default_factory=list)

    def apply_joined(self, report: dict) -> None:
        self.joined = True
        self.manifest = report.get("manifest") or self.manifest
        self.manifest_hash = report.get("manifest_hash")
        self.local = {name: report.get(name) for name in LOCAL_FIELDS}
        self.target_batch_size = self.manifest.get("target_batch_size", self.target_batch_size)

    def apply_step(self, report: dict) -> None:
        self.contributed_samples += int(report.get("samples") or 0)
        self.samples_per_second = report.get("samples_per_second")
        self.loss = report.get("loss", self.loss)
        self.epoch = max(self.epoch, int(report.get("epoch") or 0))

    def apply_epoch(self, report: dict) -> None:
        self.epoch = max(self.epoch, int(report["epoch"]))
        self.last_epoch_at = report.get("ended_at") or time.time()

    def apply_swarm(self, report: dict) -> list[dict]:
        """Take a swarm snapshot; returns the peer rows (ours marked ``is_local``)."""
        self.epoch = max(self.epoch, int(report.get("epoch") or 0))
        self.samples_accumulated = int(report.get("samples_accumulated") or 0)
        self.target_batch_size = report.get("target_batch_size") or self.target_batch_size
        self.eta_next_epoch_s = report.get("eta_next_epoch_s")
        self.num_peers = int(report.get("num_peers") or 0)
        now = time.time()
        own_id = self.local.get("peer_id")
        self.peers = []
        for raw in report.get("peers") or []:
            if not isinstance(raw, dict):
                continue
            row = {name: raw.get(name) for name in PEER_FIELDS}
            row["last_seen"] = row["last_seen"] or raw.get("time") or now
            row["is_local"] = row["peer_id"] == own_id
            self.peers.append(row)
        return self.peers

    def run_status(self) -> dict:
        return {
            "id": self.run_id,
            "mode": self.manifest.get("mode"),
            "model": self.manifest.get("model"),
            "manifest_hash": self.manifest_hash,
            "epoch": self.epoch,
            "samples_accumulated": self.samples_accumulated,
            "target_batch_size": self.target_batch_size,
            "eta_next_epoch_s": self.eta_next_epoch_s,
            "num_peers": self.num_peers,
            "last_epoch_at": self.last_epoch_at,
        }

    def local_status(self) -> dict:
        return {
            **self.local,
            "samples_per_second": self.samples_per_second,
            "loss": self.loss,
            "contributed_samples": self.contributed_samples,
        }

    def reachability_health(self) -> list[dict]:
        if self.local.get("reachability") != "relayed":
            return []
        return [
            {
                "level": "warning",
                "message": "this peer is reachable only through a relay, which slows averaging",
                "fix": "forward the TCP port of dht.host_maddrs in your router, or set dht.announce_maddrs to your public address",
            }
        ]
