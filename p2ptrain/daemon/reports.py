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

from p2ptrain.daemon import state as states
from p2ptrain.daemon.run_view import RunView
from p2ptrain.daemon.server import Broadcaster
from p2ptrain.daemon.state import DesiredState, Lifecycle
from p2ptrain.daemon.traffic_month import MonthlyTraffic
from p2ptrain.daemon.worker_handle import WorkerHandle
from p2ptrain.daemon.workers import WorkerRestarts, WorkerSlot
from p2ptrain.storage.database import Database

log = logging.getLogger(__name__)


class WorkerReports:
    """The ``_report_<type>`` handlers of the daemon, and ``on_report`` that picks one."""

    run: RunView
    db: Database
    broadcaster: Broadcaster
    desired: DesiredState
    lifecycle: Lifecycle
    slots: list[WorkerSlot]
    workers: dict[str, WorkerHandle]
    restarts: dict[str, WorkerRestarts]
    traffic_month: MonthlyTraffic

    def on_report(self, name: str, report: dict) -> None:
        """Handle one report of worker ``name`` (a slot name)."""
        kind = report["type"]
        handler = getattr(self, f"_report_{kind}", None)
        if handler is None:
            log.warning("ignoring a worker report of unknown type %r", kind)
            return
        try:
            handler(name, report)
        except (KeyError, TypeError, ValueError) as error:
            log.warning("ignoring a malformed %s report from worker %s: %s", kind, name, error)

    def _worker_words(self, name: str) -> str:
        """' (gpu1)' when there are several workers, so events say which one."""
        return f" ({name})" if len(self.slots) > 1 else ""

    def _report_joined(self, name: str, report: dict) -> None:
        self.run.apply_joined(name, report)
        self.restarts[name].crashes_in_a_row = 0
        if self.desired.run is not None and report.get("manifest"):
            # Keep the manifest: a restarted daemon can rejoin even if the creator is gone.
            self.desired.run["manifest"] = report["manifest"]
            self._save_desired()
        self.db.record_run_joined(self.run.run_id, report.get("manifest") or {})
        self.record_event("joined", f"joined run {self.run.run_id!r} as {report.get('peer_id')}{self._worker_words(name)}", {"worker": name})
        if self.lifecycle.state == states.JOINING:
            self._enter(states.TRAINING)

    def _report_network(self, name: str, report: dict) -> None:
        before = self.run.workers[name].local.get("reachability")
        self.run.apply_network(name, report)
        if report["reachability"] != before:
            self.record_event("reachability", f"reachability: {report['reachability']} ({report.get('answered', 0)} of "
                              f"{report.get('asked', 0)} asked peers answered){self._worker_words(name)}",
                              {key: report.get(key) for key in ("reachability", "asked", "answered", "reached", "averaging_client")})

    def _report_traffic(self, name: str, report: dict) -> None:
        self.run.apply_traffic(name, report)
        self.traffic_month.add_report(name, report["since"], report["sent_bytes"], report["received_bytes"])

    def _report_state(self, name: str, report: dict) -> None:
        worker_state = report["state"]
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

    def _report_step(self, name: str, report: dict) -> None:
        self.run.apply_step(name, report)
        self.db.record_step(
            self.run.run_id,
            report.get("epoch"),
            report.get("loss"),
            report.get("samples"),
            report.get("samples_per_second"),
            ts=report.get("ts"),
            worker=name,
        )
        self.broadcaster.publish("step", {**report, "worker": name})

    def _report_epoch(self, name: str, report: dict) -> None:
        self.run.apply_epoch(report)
        self.db.record_epoch(
            self.run.run_id,
            report["epoch"],
            report.get("started_at"),
            report.get("ended_at"),
            report.get("duration_s"),
            report.get("num_peers"),
            report.get("global_samples"),
            report.get("loss"),
            report.get("val_loss"),
        )
        self.broadcaster.publish("epoch", {**report, "worker": name})

    def _report_swarm(self, name: str, report: dict) -> None:
        peers = self.run.apply_swarm(report)
        self.db.record_peers(self.run.run_id, peers)
        self.broadcaster.publish("peers", {"run_id": self.run.run_id, "peers": peers})

    def _report_event(self, name: str, report: dict) -> None:
        data = report.get("data")
        if len(self.slots) > 1:
            data = {**(data if isinstance(data, dict) else {}), "worker": name}
        self.record_event(report["kind"], report.get("message", "") + self._worker_words(name), data)

    def _report_error(self, name: str, report: dict) -> None:
        message, fix = report.get("message", "training worker error") + self._worker_words(name), report.get("fix", "")
        if report.get("kind") == "oom":
            self.restarts[name].ran_out_of_memory = True
        self.record_event("worker-error", message, {"fix": fix, "fatal": bool(report.get("fatal")), "worker": name})
        if report.get("fatal"):
            # A fatal error (no such run, bad manifest...) needs the user: stop retrying, and end the other workers.
            self.desired = DesiredState()
            self._save_desired()
            self._send_all("leave")
            self._enter(states.ERROR, error={"message": message, "fix": f"{fix}; then join again (p2ptrain leave clears this error)"})
        else:
            self.run.warnings.append({"level": "warning", "message": message, "fix": fix})

    def _report_left(self, name: str, report: dict) -> None:
        self.record_event("left", f"left run {self.run.run_id!r}{self._worker_words(name)}", {"worker": name})
