"""What the training workers report, and what each report changes.

Each kind of report (``p2ptrain.worker_pipe``) has one handler in
``WorkerReports.handlers``: it updates the run view, the database and the
subscribers, and hands what changes the daemon's state (a worker joined,
finished its epoch, failed for good) to ``RunControl``. Each handler gets the
reporting worker's name (``gpu1``, ``cpu``) and the report.

To handle a new kind of report, add its handler to the table;
``tests/unit/test_worker_pipe.py`` fails while a kind has none.
"""

from __future__ import annotations

import logging
from typing import Callable

from p2ptrain.control_types import Health, PeersUpdate, Push
from p2ptrain.daemon.event_log import EventLog
from p2ptrain.daemon.run_control import RunControl
from p2ptrain.daemon.run_view import RunView
from p2ptrain.daemon.server import Broadcaster
from p2ptrain.daemon.traffic_month import MonthlyTraffic
from p2ptrain.daemon.worker_pool import WorkerPool
from p2ptrain.daemon.worker_state import PAUSED, PAUSING, TRAINING
from p2ptrain.storage.bans import record_ban
from p2ptrain.storage.database import Database
from p2ptrain.worker_pipe import (
    Epoch, Error, Event, Joined, Left, Network, PlanWanted, Report, StateChanged, Step, Swarm, Traffic, encode,
)

log = logging.getLogger(__name__)


class WorkerReports:
    """The daemon's handler of each kind of worker report.

    Args:
        run: the run view the reports build.
        db: where steps, epochs, peers and runs are recorded.
        broadcaster: pushes steps, epochs and peers to subscribers.
        events: where events are recorded.
        control: the state machine, told what changes the state.
        pool: the workers (their crash records, and how many there are).
        traffic_month: this month's traffic, which ``Traffic`` reports add to (None: not counted).
    """

    def __init__(self, run: RunView, db: Database, broadcaster: Broadcaster, events: EventLog, control: RunControl,
                 pool: WorkerPool, traffic_month: MonthlyTraffic | None = None):
        self.run, self.db, self.broadcaster, self.events, self.control, self.pool = run, db, broadcaster, events, control, pool
        self.traffic_month = traffic_month
        self.handlers: dict[type[Report], Callable] = {
            PlanWanted: self.plan_wanted,
            Joined: self.joined,
            Network: self.network,
            Traffic: self.traffic,
            StateChanged: self.state_changed,
            Step: self.step,
            Epoch: self.epoch,
            Swarm: self.swarm,
            Event: self.event,
            Error: self.error,
            Left: self.left,
        }

    def on_report(self, name: str, report: Report) -> None:
        """Handle one report of worker ``name`` (a slot name)."""
        handler = self.handlers.get(type(report))
        if handler is None:
            log.warning("ignoring a %s report of worker %s: the daemon has no handler for it", report.KIND, name)
            return
        handler(name, report)

    def plan_wanted(self, name: str, report: PlanWanted) -> None:
        """A worker started without a plan read the run's manifest: plan its device now and answer it."""
        process = self.pool.processes.get(name)
        if process is not None:
            process.send(self.pool.answer_plan(name, report.manifest))

    def joined(self, name: str, report: Joined) -> None:
        self.run.apply_joined(name, report)
        self.pool.joined(name)
        self.db.record_run_joined(self.run.run_id, report.manifest)
        self.events.record("joined", f"joined run {self.run.run_id!r} as {report.peer_id}{self.pool.worker_words(name)}", {"worker": name})
        self.control.worker_joined(report.manifest)

    def network(self, name: str, report: Network) -> None:
        before = self.run.workers[name].local.get("reachability")
        self.run.apply_network(name, report)
        if report.reachability != before:
            self.events.record(
                "reachability", f"reachability: {report.reachability} ({report.answered} of {report.asked} asked peers "
                f"answered){self.pool.worker_words(name)}",
                {"reachability": report.reachability, "asked": report.asked, "answered": report.answered,
                 "reached": report.reached, "averaging_client": report.averaging_client, "worker": name})

    def traffic(self, name: str, report: Traffic) -> None:
        self.run.apply_traffic(name, report)
        if self.traffic_month is not None:
            self.traffic_month.add_report(name, report.since, report.sent_bytes, report.received_bytes)

    def state_changed(self, name: str, report: StateChanged) -> None:
        view = self.run.workers[name]
        if report.state == TRAINING:
            self.run.states.move(name, view, TRAINING)
        else:
            # it has left the swarm and exits next: "pausing" until its process has ended (then "paused",
            # RunControl._released), so `p2ptrain pause` returns only once the device is free
            view.stopped()
            self.run.states.move(name, view, PAUSING if report.state == PAUSED else report.state)
        self.control.worker_state(report.state, report.reason)

    def step(self, name: str, report: Step) -> None:
        self.run.apply_step(name, report)
        self.db.record_step(
            self.run.run_id, report.epoch, report.loss, report.samples, report.samples_per_second, ts=report.ts, worker=name
        )
        self.broadcaster.publish(Push.STEP, {**encode(report), "worker": name})

    def epoch(self, name: str, report: Epoch) -> None:
        self.run.apply_epoch(report)
        self.db.record_epoch(
            self.run.run_id,
            report.epoch,
            report.started_at,
            report.ended_at,
            report.duration_s,
            report.num_peers,
            report.global_samples,
            report.loss,
            report.val_loss,
        )
        self.broadcaster.publish(Push.EPOCH, {**encode(report), "worker": name})

    def swarm(self, name: str, report: Swarm) -> None:
        peers = self.run.apply_swarm(report)
        self.db.record_peers(self.run.run_id, peers)
        self.broadcaster.publish(Push.PEERS, PeersUpdate(run_id=self.run.run_id, peers=peers).to_dict())

    def event(self, name: str, report: Event) -> None:
        data = {**report.data, "worker": name} if len(self.pool.slots) > 1 else report.data
        self.events.record_repeating(report.kind, report.message + self.pool.worker_words(name), data)
        if report.kind == "diverged":
            self.run.divergence = report.message
        if report.kind == "peer-banned":
            self._record_ban(report.data)

    def _record_ban(self, data: dict) -> None:
        """A worker banned a peer: store it for the run (``storage/bans.py``) and mark it in the peer rows."""
        peer_id = data.get("peer_id")
        if not isinstance(peer_id, str) or not peer_id:
            log.warning("ignoring a peer-banned event without a peer id: %r", data)
            return
        record_ban(self.db, self.run.run_id, peer_id, data.get("reason"), data.get("rounds_named"))
        self.run.banned.add(peer_id)

    def error(self, name: str, report: Error) -> None:
        message = report.message + self.pool.worker_words(name)
        if report.out_of_memory and not report.fatal:
            self.pool.ran_out_of_memory(name, report)
        self.events.record("worker-error", message, {"fix": report.fix, "fatal": report.fatal, "worker": name})
        if report.fatal:
            self.control.worker_failed(message, report.fix)
        else:
            self.run.warnings.append(Health(level="warning", message=message, fix=report.fix))

    def left(self, name: str, report: Left) -> None:
        self.events.record("left", f"left run {self.run.run_id!r}{self.pool.worker_words(name)}", {"worker": name})
