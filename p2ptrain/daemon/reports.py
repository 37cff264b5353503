"""What the training workers report, and what each report changes.

A report (DEVELOPERS.md, "Worker pipe") updates the run view, the database,
the subscribers and, for ``joined``, ``state`` and ``error``, the daemon's
state. ``WorkerReports`` is mixed into ``Daemon`` (``supervisor.py``): it
uses the attributes declared below and the daemon's ``_enter``,
``_save_desired``, ``_send_all`` and ``record_event``. Each handler gets the
reporting worker's name (``gpu1``, ``cpu``) and the report.
"""

from __future__ import annotations

import logging
from typing import Callable

from p2ptrain.daemon import state as states
from p2ptrain.daemon.run_view import RunView
from p2ptrain.daemon.server import Broadcaster
from p2ptrain.daemon.state import DesiredState, Lifecycle
from p2ptrain.daemon.worker_process import WorkerProcess
from p2ptrain.daemon.worker_slots import WorkerRestarts, WorkerSlot
from p2ptrain.storage.database import Database
from p2ptrain.worker_pipe import Epoch, Error, Event, Joined, Leave, Left, Report, StateChanged, Step, Swarm, encode

log = logging.getLogger(__name__)


class WorkerReports:
    """The report handlers of the daemon, and ``on_report`` that picks one from ``report_handlers``."""

    run: RunView
    db: Database
    broadcaster: Broadcaster
    desired: DesiredState
    lifecycle: Lifecycle
    slots: list[WorkerSlot]
    workers: dict[str, WorkerProcess]
    restarts: dict[str, WorkerRestarts]

    def report_handlers(self) -> dict[type[Report], Callable]:
        """The handler of each kind of report: ``handler(worker name, report)``."""
        return {
            Joined: self._report_joined,
            StateChanged: self._report_state,
            Step: self._report_step,
            Epoch: self._report_epoch,
            Swarm: self._report_swarm,
            Event: self._report_event,
            Error: self._report_error,
            Left: self._report_left,
        }

    def on_report(self, name: str, report: Report) -> None:
        """Handle one report of worker ``name`` (a slot name)."""
        handler = self.report_handlers().get(type(report))
        if handler is None:
            log.warning("ignoring a %s report of worker %s: the daemon has no handler for it", report.KIND, name)
            return
        handler(name, report)

    def _worker_words(self, name: str) -> str:
        """' (gpu1)' when there are several workers, so events say which one."""
        return f" ({name})" if len(self.slots) > 1 else ""

    def _report_joined(self, name: str, report: Joined) -> None:
        self.run.apply_joined(name, report)
        self.restarts[name].crashes_in_a_row = 0
        if self.desired.run is not None and report.manifest:
            # Keep the manifest: a restarted daemon can rejoin even if the creator is gone.
            self.desired.run["manifest"] = report.manifest
            self._save_desired()
        self.db.record_run_joined(self.run.run_id, report.manifest)
        self.record_event("joined", f"joined run {self.run.run_id!r} as {report.peer_id}{self._worker_words(name)}", {"worker": name})
        if self.lifecycle.state == states.JOINING:
            self._enter(states.TRAINING)

    def _report_state(self, name: str, report: StateChanged) -> None:
        worker_state = report.state
        self.run.workers[name].state = worker_state
        if worker_state == "finished":
            # every running worker completes its epoch before the daemon pauses
            if any(self.run.workers[other].state != "finished" for other in self.workers):
                return
            self.desired.paused = True
            self.desired.pause_until = None
            self._save_desired()
            self.record_event("finished", "finished the epoch; paused")
            self._enter(states.PAUSED, "user")
        elif worker_state == "training" and self.lifecycle.state == states.JOINING:
            self._enter(states.TRAINING)

    def _report_step(self, name: str, report: Step) -> None:
        self.run.apply_step(name, report)
        self.db.record_step(
            self.run.run_id, report.epoch, report.loss, report.samples, report.samples_per_second, ts=report.ts, worker=name
        )
        self.broadcaster.publish("step", {**encode(report), "worker": name})

    def _report_epoch(self, name: str, report: Epoch) -> None:
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
        self.broadcaster.publish("epoch", {**encode(report), "worker": name})

    def _report_swarm(self, name: str, report: Swarm) -> None:
        peers = self.run.apply_swarm(report)
        self.db.record_peers(self.run.run_id, peers)
        self.broadcaster.publish("peers", {"run_id": self.run.run_id, "peers": [peer.to_dict() for peer in peers]})

    def _report_event(self, name: str, report: Event) -> None:
        data = {**report.data, "worker": name} if len(self.slots) > 1 else report.data
        self.record_event(report.kind, report.message + self._worker_words(name), data)

    def _report_error(self, name: str, report: Error) -> None:
        message, fix = report.message + self._worker_words(name), report.fix
        if report.out_of_memory:
            self.restarts[name].ran_out_of_memory = True
        self.record_event("worker-error", message, {"fix": fix, "fatal": report.fatal, "worker": name})
        if report.fatal:
            # A fatal error (no such run, bad manifest...) needs the user: stop retrying, and end the other workers.
            self.desired = DesiredState()
            self._save_desired()
            self._send_all(Leave())
            self._enter(states.ERROR, error={"message": message, "fix": f"{fix}; then join again (p2ptrain leave clears this error)"})
        else:
            self.run.warnings.append({"level": "warning", "message": message, "fix": fix})

    def _report_left(self, name: str, report: Left) -> None:
        self.record_event("left", f"left run {self.run.run_id!r}{self._worker_words(name)}", {"worker": name})
