"""What the daemon knows of the run it is in, built from the worker's reports.

Each worker reports ``joined`` (who it is in the swarm), ``step`` (local
progress), ``epoch`` (an averaging round is done) and ``swarm`` (the global
progress and the other peers). This module keeps the latest of each, per
worker where it is a worker's own, and shapes the ``run``, ``local`` and
``peers`` parts of the control protocol.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from p2ptrain.daemon.traffic_month import monthly_estimate_gb
from p2ptrain.peers.reachability import RELAYED, UNREACHABLE, fix_for

LOCAL_FIELDS = (
    "peer_id",
    "nickname",
    "addresses",
    "reachability",
    "reachability_checked_at",
    "averaging_client",
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


WORKER_FIELDS = (
    "device",
    "peer_id",
    "precision",
    "quantization",
    "micro_batch",
    "grad_accum",
    "samples_per_second",
    "loss",
    "contributed_samples",
    "state",
)


@dataclass
class WorkerView:
    """The latest reports of one training worker (one peer of the swarm).

    Attributes:
        device: the worker's device in this machine's numbering (``cuda:1``,
            ``cpu``); it wins over the worker's own name for it, which is
            ``cuda:0`` in every GPU worker (each sees only its card).
        state: ``joining`` from its start, then what the worker reports
            (``training``, ``paused``, ``finished``; it reports one right after
            ``joined``); ``restarting`` or ``oom-backoff`` between a crash and
            the next start.
        contributed_samples: kept across restarts of the worker within the run.
    """

    device: str
    state: str = "joining"
    joined: bool = False
    local: dict[str, Any] = field(default_factory=dict)
    samples_per_second: float | None = None
    loss: float | None = None
    contributed_samples: int = 0
    traffic: dict[str, Any] = field(default_factory=dict)

    def apply_joined(self, report: dict) -> None:
        self.joined = True
        self.local = {name: report.get(name) for name in LOCAL_FIELDS}
        self.local["device"] = self.device

    def apply_network(self, report: dict) -> None:
        """A reachability check's result (``network`` report): the measured reachability and addresses."""
        self.local["reachability"] = report["reachability"]
        self.local["addresses"] = list(report.get("addresses") or self.local.get("addresses") or [])
        self.local["averaging_client"] = bool(report.get("averaging_client"))
        self.local["reachability_checked_at"] = report.get("checked_at")

    def apply_step(self, report: dict) -> None:
        self.contributed_samples += int(report.get("samples") or 0)
        self.samples_per_second = report.get("samples_per_second")
        self.loss = report.get("loss", self.loss)

    def stopped(self, state: str) -> None:
        """The process has ended; ``state`` says what comes next (``restarting``, ``oom-backoff``)."""
        self.joined = False
        self.samples_per_second = None
        self.state = state

    def status(self) -> dict:
        return {
            **self.local,
            "device": self.device,
            "samples_per_second": self.samples_per_second,
            "loss": self.loss,
            "contributed_samples": self.contributed_samples,
            "state": self.state,
        }


@dataclass
class RunView:
    """The latest reported state of one run, as seen from this machine's workers.

    ``workers`` maps each worker's name (``gpu0``, ``cpu``...) to its view, in
    the order the workers were started; the first is the one ``local`` shows.
    """

    run_id: str | None = None
    manifest: dict[str, Any] = field(default_factory=dict)
    manifest_hash: str | None = None
    workers: dict[str, WorkerView] = field(default_factory=dict)
    epoch: int = 0
    samples_accumulated: int = 0
    target_batch_size: int | None = None
    eta_next_epoch_s: float | None = None
    num_peers: int = 0
    last_epoch_at: float | None = None
    peers: list[dict] = field(default_factory=list)
    warnings: list[dict] = field(default_factory=list)

    @property
    def joined(self) -> bool:
        """At least one worker is in the swarm."""
        return any(view.joined for view in self.workers.values())

    def worker(self, name: str, device: str) -> WorkerView:
        """The view of worker ``name``, added (state ``joining``) if it is new."""
        if name not in self.workers:
            self.workers[name] = WorkerView(device=device)
        return self.workers[name]

    def apply_joined(self, name: str, report: dict) -> None:
        self.manifest = report.get("manifest") or self.manifest
        self.manifest_hash = report.get("manifest_hash")
        self.target_batch_size = self.manifest.get("target_batch_size", self.target_batch_size)
        self.workers[name].apply_joined(report)

    def apply_network(self, name: str, report: dict) -> None:
        self.workers[name].apply_network(report)

    def apply_traffic(self, name: str, report: dict) -> None:
        self.workers[name].traffic = {key: report.get(key) for key in ("bytes_per_s", "sent_bytes_per_s",
                                                                      "received_bytes_per_s", "measured_at")}

    def traffic_status(self, month_used_gb: float, moment: datetime) -> dict | None:
        """DESIGN's ``local.traffic``, summed over the running workers: bytes per second by kind (sent +
        received), ``month_gb`` (that rate over this whole month) and ``month_used_gb`` (counted so far)."""
        measured = [view.traffic for view in self.workers.values() if view.joined and view.traffic]
        if not measured:
            return None
        kinds = {kind: sum(traffic["bytes_per_s"].get(kind, 0.0) for traffic in measured)
                 for kind in measured[0]["bytes_per_s"]}
        total = sum(kinds.values())
        return {
            "bytes_per_s": kinds,
            "sent_bytes_per_s": sum(traffic.get("sent_bytes_per_s") or 0.0 for traffic in measured),
            "received_bytes_per_s": sum(traffic.get("received_bytes_per_s") or 0.0 for traffic in measured),
            "month_gb": monthly_estimate_gb(total, moment),
            "month_used_gb": month_used_gb,
            "measured_at": measured[0].get("measured_at"),
        }

    def apply_step(self, name: str, report: dict) -> None:
        self.workers[name].apply_step(report)
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
        own_ids = {view.local.get("peer_id") for view in self.workers.values() if view.local}
        self.peers = []
        for raw in report.get("peers") or []:
            if not isinstance(raw, dict):
                continue
            row = {name: raw.get(name) for name in PEER_FIELDS}
            row["last_seen"] = row["last_seen"] or raw.get("time") or now
            row["is_local"] = row["peer_id"] in own_ids
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

    def local_status(self) -> dict | None:
        """DESIGN's ``local``: the first joined worker's view, with ``workers``
        (every worker's view) and, when there are several, ``samples_per_second``
        and ``contributed_samples`` summed over all of them. None before any joined."""
        first = next((view for view in self.workers.values() if view.joined), None)
        if first is None:
            return None
        views = list(self.workers.values())
        local = first.status()
        del local["state"]  # the daemon's state is status["state"]
        local["workers"] = [{name: view.status().get(name) for name in WORKER_FIELDS} for view in views]
        if len(views) > 1:
            rates = [view.samples_per_second for view in views if view.samples_per_second is not None]
            local["samples_per_second"] = sum(rates) if rates else None
            local["contributed_samples"] = sum(view.contributed_samples for view in views)
        return local

    def reachability_health(self, host_maddrs: list[str], announce_maddrs: list[str]) -> list[dict]:
        """A warning with its fix when peers could not dial the first joined worker directly
        (``dht.host_maddrs`` and ``dht.announce_maddrs`` from the config name the port)."""
        local = next((view.local for view in self.workers.values() if view.joined), None)
        reachability = (local or {}).get("reachability")
        fix = fix_for(reachability, host_maddrs, announce_maddrs, (local or {}).get("addresses") or [])
        if fix is None:
            return []
        message = {
            RELAYED: "other peers reach this one only through a relay",
            UNREACHABLE: "other peers cannot dial this one (behind NAT or a firewall)",
        }[reachability]
        if local.get("averaging_client"):
            message += "; it averages as a client (sends its share, never reduces)"
        return [{"level": "warning", "message": message, "fix": fix}]
