"""What the daemon knows of the run it is in, built from the worker's reports.

Each worker reports ``joined`` (who it is in the swarm), ``step`` (local
progress), ``epoch`` (an averaging round is done) and ``swarm`` (the global
progress and the other peers). This module keeps the latest of each, per
worker where it is a worker's own, and shapes the ``run``, ``local`` and
``peers`` parts of the control protocol.

A paused daemon has no worker (a pause ends it, to give its memory back): the
view then shows the last reports, ``run.as_of`` saying when they came.
``snapshot`` and ``restore`` keep that view across a restart of the daemon
while it is paused.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

from p2ptrain.control_types import Health, LocalStatus, MalformedReply, Plan, RunStatus, TrafficStatus, WorkerStatus
from p2ptrain.daemon.traffic_month import monthly_estimate_gb
from p2ptrain.daemon.worker_state import JOINING, WorkerState, WorkerStates
from p2ptrain.peers.net.reachability import RELAYED, UNREACHABLE, fix_for
from p2ptrain.worker_pipe import Epoch, Joined, Network, PeerRow, PortMove, Step, Swarm, Traffic, UnusedSamples

# what status.local shows of a worker's Joined report: all of it but the run's manifest, the
# port moves (health lines) and the sample totals (kept in the view, updated by every Step)
LOCAL_FIELDS = tuple(
    report_field.name for report_field in fields(Joined)
    if report_field.name not in ("manifest", "manifest_hash", "port_moves", "trained_samples", "contributed_samples", "unused_samples")
)

UNUSED_REASONS = tuple(reason.name for reason in fields(UnusedSamples))
# what status.local shows of the plan until the worker has joined and says what it confirmed
PLANNED_FIELDS = ("precision", "quantization", "gradient_checkpointing", "micro_batch", "grad_accum")


@dataclass
class WorkerView:
    """The latest reports of one training worker (one peer of the swarm).

    Attributes:
        device: the worker's device in this machine's numbering (``cuda:1``,
            ``cpu``); it wins over the worker's own name for it, which is
            ``cuda:0`` in every GPU worker (each sees only its card).
        state: ``joining`` from its start, then as ``worker_state.py`` says;
            moved only by ``RunView.states`` (``WorkerStates.move``).
        trained_samples, contributed_samples, unused_samples: the worker's totals for
            the run (``p2ptrain.peers.training.sample_account``): all it trained, what entered
            an adopted average or optimizer step, and what never will, by reason.
            The worker restores them from its checkpoint, so they survive restarts;
            the largest reported is kept, so they survive a restart that lost its checkpoint.
        plan: the daemon's hardware plan for it (``daemon/plan.py: Plan.to_status``, with its
            rationale), from when it was made: before the worker starts, or once a joining
            worker read the run's manifest. Until the worker joins, ``status`` shows the plan's
            precision, quantization and micro-batch; then what the worker confirmed.
        waiting: why the samples the run has not used yet wait, when it is more than the
            current round (``Step.waiting``: rounds that found no other peer), else None.
    """

    device: str
    state: WorkerState = JOINING
    joined: bool = False
    local: dict[str, Any] = field(default_factory=dict)
    samples_per_second: float | None = None
    loss: float | None = None
    trained_samples: int = 0
    contributed_samples: int = 0
    unused_samples: dict[str, int] = field(default_factory=lambda: dict.fromkeys(UNUSED_REASONS, 0))
    port_moves: list[PortMove] = field(default_factory=list)
    traffic: dict[str, Any] = field(default_factory=dict)
    plan: Plan | None = None
    waiting: str | None = None

    def apply_joined(self, report: Joined) -> None:
        self.joined = True
        self.local = {name: getattr(report, name) for name in LOCAL_FIELDS}
        self.local["device"] = self.device
        self.port_moves = list(report.port_moves)
        self.take_totals(report)

    def take_totals(self, report: Joined | Step) -> None:
        """The worker's sample totals from ``report``, never below what it reported before."""
        self.trained_samples = max(self.trained_samples, report.trained_samples)
        self.contributed_samples = max(self.contributed_samples, report.contributed_samples)
        reported = report.unused_samples.to_dict()
        self.unused_samples = {reason: max(self.unused_samples[reason], reported[reason]) for reason in UNUSED_REASONS}

    def apply_network(self, report: Network) -> None:
        """A reachability check's result: the measured reachability and addresses."""
        self.local["reachability"] = report.reachability
        self.local["addresses"] = list(report.addresses or self.local.get("addresses") or [])
        self.local["averaging_client"] = report.averaging_client
        self.local["reachability_checked_at"] = report.checked_at

    def apply_step(self, report: Step) -> None:
        self.take_totals(report)
        self.samples_per_second = report.samples_per_second
        self.loss = report.loss
        self.waiting = report.waiting

    def stopped(self) -> None:
        """The process has left the swarm (or ended): it trains no more, until it starts again."""
        self.joined = False
        self.samples_per_second = None
        self.waiting = None

    def shown(self) -> dict[str, Any]:
        """What ``status`` shows of this worker, by field name (``control_types.LocalStatus``'s names)."""
        planned = {name: getattr(self.plan, name) for name in PLANNED_FIELDS} if self.plan else {}
        return {
            **planned,
            **self.local,
            "plan": self.plan,
            "device": self.device,
            "samples_per_second": self.samples_per_second,
            "loss": self.loss,
            "trained_samples": self.trained_samples,
            "contributed_samples": self.contributed_samples,
            "unused_samples": dict(self.unused_samples),
            "waiting": self.waiting,
        }

    def status(self) -> WorkerStatus:
        """This worker as ``status.local.workers`` shows it."""
        shown = self.shown()
        return WorkerStatus(state=self.state, **{name: shown.get(name) for name in WorkerStatus.SCHEMA if name != "state"})


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
    reported_at: float | None = None
    peers: list[PeerRow] = field(default_factory=list)
    warnings: list[Health] = field(default_factory=list)
    banned: set[str] = field(default_factory=set)  # peer ids this machine banned in this run (storage/bans.py)
    divergence: str | None = None  # the last ``diverged`` event's message: what the health line says while paused for it
    # the only writer of the workers' states (worker_state.py); kept by ``reset``, with its listener
    states: WorkerStates = field(default_factory=WorkerStates, repr=False, compare=False)

    def reset(self, run_id: str | None = None, manifest: dict[str, Any] | None = None) -> None:
        """Forget all reports: run ``run_id`` starts (with ``manifest`` if known), or none when None."""
        self.__dict__.update(RunView(run_id=run_id, manifest=manifest or {}, states=self.states).__dict__)

    @property
    def joined(self) -> bool:
        """At least one worker is in the swarm."""
        return any(view.joined for view in self.workers.values())

    def worker(self, name: str, device: str) -> WorkerView:
        """The view of worker ``name``, added (state ``joining``) if it is new."""
        if name not in self.workers:
            self.workers[name] = WorkerView(device=device)
        return self.workers[name]

    def apply_joined(self, name: str, report: Joined) -> None:
        self.manifest = report.manifest or self.manifest
        self.manifest_hash = report.manifest_hash
        self.target_batch_size = self.manifest.get("target_batch_size", self.target_batch_size)
        self.workers[name].apply_joined(report)
        self.reported_at = time.time()

    def apply_network(self, name: str, report: Network) -> None:
        self.workers[name].apply_network(report)

    def apply_traffic(self, name: str, report: Traffic) -> None:
        self.workers[name].traffic = {"bytes_per_s": report.bytes_per_s, "totals": report.totals, "since": report.since,
                                      "totals_at": report.totals_at,
                                      "sent_bytes_per_s": report.sent_bytes_per_s,
                                      "received_bytes_per_s": report.received_bytes_per_s,
                                      "measured_at": report.measured_at}

    def traffic_status(self, month_used_gb: float, moment: datetime) -> TrafficStatus | None:
        """The status object's ``local.traffic``, summed over the running workers: bytes per second by kind (sent +
        received), bytes by kind since each began counting (``totals``; ``since``: the latest began then; ``totals_at``:
        the oldest of their readings),
        ``month_gb`` (that rate over this whole month) and ``month_used_gb`` (counted so far)."""
        measured = [view.traffic for view in self.workers.values() if view.joined and view.traffic]
        if not measured:
            return None
        kinds = {kind: sum(traffic["bytes_per_s"].get(kind, 0.0) for traffic in measured)
                 for kind in measured[0]["bytes_per_s"]}
        total = sum(kinds.values())
        return TrafficStatus(
            bytes_per_s=kinds,
            totals={kind: sum(traffic["totals"].get(kind, 0.0) for traffic in measured) for kind in measured[0]["totals"]},
            since=max(traffic["since"] for traffic in measured),
            totals_at=min(traffic["totals_at"] for traffic in measured),
            sent_bytes_per_s=sum(traffic.get("sent_bytes_per_s") or 0.0 for traffic in measured),
            received_bytes_per_s=sum(traffic.get("received_bytes_per_s") or 0.0 for traffic in measured),
            month_gb=monthly_estimate_gb(total, moment),
            month_used_gb=month_used_gb,
            measured_at=measured[0].get("measured_at"),
        )

    def apply_step(self, name: str, report: Step) -> None:
        self.workers[name].apply_step(report)
        self.epoch = max(self.epoch, report.epoch)
        self.reported_at = time.time()

    def apply_epoch(self, report: Epoch) -> None:
        self.epoch = max(self.epoch, report.epoch)
        self.last_epoch_at = report.ended_at or time.time()
        self.reported_at = time.time()

    def apply_swarm(self, report: Swarm) -> list[PeerRow]:
        """Take a swarm snapshot; returns the peer rows (ours marked ``is_local``)."""
        self.epoch = max(self.epoch, report.epoch)
        self.samples_accumulated = report.samples_accumulated
        self.target_batch_size = report.target_batch_size or self.target_batch_size
        self.eta_next_epoch_s = report.eta_next_epoch_s
        self.num_peers = report.num_peers
        now = self.reported_at = time.time()
        own_ids = {view.local.get("peer_id") for view in self.workers.values() if view.local}
        self.peers = [row.replace(last_seen=row.last_seen or now, is_local=row.peer_id in own_ids, banned=row.peer_id in self.banned)
                      for row in report.peers]
        return self.peers

    @property
    def as_of(self) -> float | None:
        """None while a worker is in the swarm; else when a worker last reported what is shown (paused: none runs)."""
        return None if self.joined else self.reported_at

    def run_status(self) -> RunStatus:
        return RunStatus(
            id=self.run_id,
            mode=self.manifest.get("mode"),
            model=self.manifest.get("model"),
            manifest_hash=self.manifest_hash,
            epoch=self.epoch,
            samples_accumulated=self.samples_accumulated,
            target_batch_size=self.target_batch_size,
            eta_next_epoch_s=self.eta_next_epoch_s if self.joined else None,
            num_peers=self.num_peers,
            last_epoch_at=self.last_epoch_at,
            as_of=self.as_of,
        )

    def local_status(self) -> LocalStatus | None:
        """The status object's ``local``: the first joined worker's view (or, with none joined, as
        while paused, the first that ever joined: its last numbers), with ``workers``
        (every worker's view) and, when there are several, ``samples_per_second``,
        ``trained_samples``, ``contributed_samples`` and ``unused_samples`` summed
        over all of them. Before any joined, the first planned one (its plan); None before that."""
        views = self.workers.values()
        first = (next((view for view in views if view.joined), None) or next((view for view in views if view.local), None)
                 or next((view for view in views if view.plan), None))
        if first is None:
            return None
        views = list(self.workers.values())
        shown = first.shown()
        local = LocalStatus(**{name: shown[name] for name in LocalStatus.SCHEMA if name in shown},
                            workers=[view.status() for view in views])
        if len(views) > 1:
            rates = [view.samples_per_second for view in views if view.samples_per_second is not None]
            local.samples_per_second = sum(rates) if rates else None
            local.trained_samples = sum(view.trained_samples for view in views)
            local.contributed_samples = sum(view.contributed_samples for view in views)
            local.unused_samples = {reason: sum(view.unused_samples[reason] for view in views) for reason in UNUSED_REASONS}
        return local

    def port_health(self) -> list[Health]:
        """A warning per configured port that was taken, so a worker listens elsewhere."""
        return [
            Health(level="warning", message=move.message, fix=move.fix)
            for view in self.workers.values()
            if view.joined
            for move in view.port_moves
        ]

    def snapshot(self) -> dict:
        """What a paused daemon shows of the run, as JSON, for ``restore`` after a restart of the daemon."""
        return {
            "run_id": self.run_id, "manifest_hash": self.manifest_hash, "epoch": self.epoch,
            "samples_accumulated": self.samples_accumulated, "target_batch_size": self.target_batch_size,
            "num_peers": self.num_peers, "last_epoch_at": self.last_epoch_at, "reported_at": self.reported_at,
            "peers": [peer.to_dict() for peer in self.peers],
            "workers": {name: {"device": view.device, "local": view.local, "loss": view.loss, "trained_samples": view.trained_samples,
                               "contributed_samples": view.contributed_samples, "unused_samples": view.unused_samples,
                               "plan": view.plan.to_dict() if view.plan else None}
                        for name, view in self.workers.items()},
        }

    def restore(self, snapshot: dict, state: WorkerState) -> None:
        """Show ``snapshot`` (of this run) until the workers report again; each worker's view is moved to ``state``."""
        for name in ("manifest_hash", "epoch", "samples_accumulated", "target_batch_size", "num_peers", "last_epoch_at", "reported_at"):
            setattr(self, name, snapshot[name])
        self.peers = [PeerRow.from_dict(row) for row in snapshot["peers"]]
        for name, worker in snapshot["workers"].items():
            view = self.worker(name, worker["device"])
            view.local, view.loss, view.plan = worker["local"], worker["loss"], _saved_plan(worker.get("plan"))
            self.states.move(name, view, state)
            view.trained_samples = worker.get("trained_samples", worker["contributed_samples"])
            view.contributed_samples = worker["contributed_samples"]
            view.unused_samples.update(worker.get("unused_samples") or {})

    def reachability_health(self, host_maddrs: list[str], announce_maddrs: list[str]) -> list[Health]:
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
            message += "; it averages as a client (sends its share, never reduces) and serves no DHT requests"
        return [Health(level="warning", message=message, fix=fix)]


def _saved_plan(saved: dict | None) -> Plan | None:
    """A plan of a saved paused view; None when there is none, or it was saved by a version with another plan."""
    try:
        return Plan.from_dict(saved, "the saved plan") if saved else None
    except MalformedReply:
        return None
