"""The supervisor: owns the state machine, the training worker and the database.

Everything runs in one asyncio event loop: control requests, worker reports
(read from the pipe as they arrive) and a tick every second that ends timed
pauses, applies the volunteer policies, flushes the database and pings the
systemd watchdog. The worker may crash; the supervisor records it and starts
it again with back-off, and never goes down with it. A worker that ran out of
memory is started again with half the micro-batch (and twice the gradient
accumulation, so a step holds as many samples); the daemon shows
``paused (oom-backoff)`` until then.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from p2ptrain import __version__, protocol
from p2ptrain.config import Config
from p2ptrain.daemon import state as states
from p2ptrain.daemon.hardware import select_gpus
from p2ptrain.daemon.hardware_view import HardwareView
from p2ptrain.daemon.model_facts import ModelFactsError, model_facts
from p2ptrain.daemon.notify import SystemdNotifier
from p2ptrain.daemon.plan import PlanError, make_plan
from p2ptrain.daemon.policies import PolicyEngine, SystemSensors
from p2ptrain.daemon.run_view import RunView
from p2ptrain.daemon.server import Broadcaster, RequestError
from p2ptrain.daemon.state import DESIRED_STATE_KEY, DesiredState, Lifecycle
from p2ptrain.daemon.worker_handle import WorkerHandle
from p2ptrain.paths import Paths
from p2ptrain.peers.worker import OUT_OF_MEMORY_EXIT_CODE  # no torch: the worker imports it lazily
from p2ptrain.storage.database import Database

log = logging.getLogger(__name__)

TICK_S = 1.0
RESTART_BACKOFF_S = (5, 10, 30, 60, 120, 300)
STOP_TIMEOUT_S = 90.0


class Daemon:
    """One p2ptrain daemon.

    Args:
        paths: where config, state, socket and logs live.
        config: the validated config.
        database: the open SQLite database (the daemon is its only writer).
        notifier: sd_notify (a no-op outside systemd).
    """

    def __init__(self, paths: Paths, config: Config, database: Database, notifier: SystemdNotifier):
        self.paths = paths
        self.config = config
        self.db = database
        self.notifier = notifier
        self.started_at = time.time()
        self.lifecycle = Lifecycle()
        self.desired = DesiredState.from_dict(database.get_setting(DESIRED_STATE_KEY))
        self.run = RunView()
        self.hardware = HardwareView()
        self.policy = PolicyEngine(config.policy, SystemSensors(gpu_index=self._gpu_index(), own_pids=self._worker_pids))
        self.broadcaster = Broadcaster(self.status)
        self.worker: WorkerHandle | None = None
        self.crashes_in_a_row = 0
        self.restart_at: float | None = None
        self.micro_batch_halvings = 0  # after out-of-memory errors in this run
        self._worker_ran_out_of_memory = False
        self._notified_status = ""
        self._stopping = asyncio.Event()

    # ----- life of the daemon -------------------------------------------------

    async def start(self) -> None:
        """Go back to what the user last asked for (a run, paused or not)."""
        self.record_event("daemon-started", f"p2ptrain {__version__} daemon started")
        if self.desired.run is not None:
            self._start_worker()

    async def run_forever(self) -> None:
        """Tick until ``request_stop``."""
        watchdog_interval = self.notifier.watchdog_interval_s()
        last_watchdog = 0.0
        while not self._stopping.is_set():
            self.tick()
            if watchdog_interval and time.monotonic() - last_watchdog >= watchdog_interval / 2:
                self.notifier.watchdog()
                last_watchdog = time.monotonic()
            try:
                await asyncio.wait_for(self._stopping.wait(), TICK_S)
            except TimeoutError:
                pass

    def request_stop(self) -> None:
        self._stopping.set()

    async def shutdown(self) -> None:
        """Orderly stop: the worker checkpoints and exits, the database is flushed."""
        self.notifier.stopping("stopping: checkpointing and flushing")
        if self.worker is not None:
            worker, self.worker = self.worker, None
            await worker.stop(STOP_TIMEOUT_S)
        self.record_event("daemon-stopped", "daemon stopped")
        self.db.close()

    def tick(self) -> None:
        now = time.time()
        if self.desired.paused and self.desired.pause_until and now >= self.desired.pause_until:
            self.record_event("pause-ended", "timed pause is over; resuming")
            self.resume()
        if self.restart_at is not None and time.monotonic() >= self.restart_at and self.desired.run is not None:
            self.restart_at = None
            self._start_worker()
        self.hardware.refresh_if_due()
        self._apply_policies()
        self.db.maybe_flush()
        line = self.one_line_status()
        if line != self._notified_status:
            self.notifier.status(line)
            self._notified_status = line

    def apply_config(self, config: Config) -> None:
        """Take a changed config: policies apply now, DHT and training settings at the next worker start."""
        self.config = config
        self.policy.settings = config.policy

    def _apply_policies(self) -> None:
        reason = self.policy.evaluate()
        state = self.lifecycle.state
        if reason and state in (states.TRAINING, states.JOINING, states.FINISHING):
            self.pause(reason)
        elif reason and state == states.PAUSED and self.lifecycle.pause_reason != reason and not self.desired.paused:
            self._enter(states.PAUSED, reason)
        elif not reason and state == states.PAUSED and self.lifecycle.pause_reason in states.POLICY_REASONS and not self.desired.paused:
            self.resume()

    def _gpu_index(self) -> int | None:
        device = self._device()
        return device.index if device is not None and device.kind == "cuda" else None

    def _device(self):
        from p2ptrain.daemon.hardware import probe

        try:
            return select_gpus(self.config.training.gpus, probe(retries=0))[0]
        except (ValueError, IndexError) as error:
            log.warning("no device to train on: %s", error)
            return None

    def _worker_pids(self) -> set[int]:
        return {self.worker.pid} if self.worker is not None and self.worker.pid else set()

    def _plan(self, manifest: dict | None) -> dict | None:
        """The hardware plan for a known manifest; None lets the worker use the manifest's hints."""
        device = self._device()
        if not manifest or device is None:
            return None
        try:
            facts = model_facts(manifest["model"], manifest.get("lora"))
            plan = make_plan(facts, manifest, device, self.config.policy.plan_policy())
        except (ModelFactsError, PlanError) as error:
            self.record_event("plan-failed", f"no hardware plan: {error}")
            return None
        for line in plan.rationale:
            log.info("plan: %s", line)
        return plan.to_dict()

    # ----- verbs ---------------------------------------------------------------

    def join(self, run_request: dict[str, Any]) -> None:
        if self.lifecycle.state in states.IN_RUN or self.lifecycle.state == states.LEAVING:
            raise RequestError(
                protocol.INVALID_STATE,
                f"already in run {self.run.run_id!r} ({self.lifecycle.state})",
                "leave it first: p2ptrain leave",
            )
        self.desired = DesiredState(run=run_request)
        self._save_desired()
        self.crashes_in_a_row = 0
        self.micro_batch_halvings = 0
        self.record_event("join", f"joining run {run_request['run_id']!r}", {"new_run": run_request.get("new_run", False)})
        self._start_worker()

    def pause(self, reason: str = "user", for_s: float | None = None) -> None:
        self._require_in_run("pause")
        if reason == "user":
            self.desired.paused = True
            self.desired.pause_until = time.time() + for_s if for_s else None
            self._save_desired()
        if self.worker is not None:
            self.worker.send("pause")
        until = f" for {for_s:.0f} s" if for_s else ""
        self.record_event("paused", f"paused ({reason}){until}", {"reason": reason, "for_s": for_s})
        self._enter(states.PAUSED, reason)

    def resume(self) -> None:
        self._require_in_run("resume")
        self.desired.paused = False
        self.desired.pause_until = None
        self._save_desired()
        if self.lifecycle.state in (states.PAUSED, states.FINISHING):
            if self.worker is not None:
                self.worker.send("resume")
            self.record_event("resumed", "resumed training")
            self._enter(states.TRAINING if self.run.joined else states.JOINING)

    def finish(self) -> None:
        self._require_in_run("finish")
        if self.lifecycle.state == states.PAUSED:
            raise RequestError(protocol.INVALID_STATE, "already paused", "resume first: p2ptrain resume")
        if self.worker is not None:
            self.worker.send("finish")
        self.record_event("finishing", "finishing the current epoch, then pausing")
        self._enter(states.FINISHING)

    def leave(self) -> None:
        if self.lifecycle.state == states.ERROR and self.desired.run is None:
            # Leaving after a fatal error only acknowledges it.
            self.record_event("left", "error acknowledged; idle")
            self._left()
            return
        self._require_in_run("leave")
        run_id = self.desired.run["run_id"] if self.desired.run else self.run.run_id
        self.desired = DesiredState()
        self._save_desired()
        self.restart_at = None
        self.record_event("leaving", f"leaving run {run_id!r}")
        if self.worker is not None and self.worker.send("leave"):
            self._enter(states.LEAVING)
        else:
            self._left()

    def _require_in_run(self, verb: str) -> None:
        if self.desired.run is None:
            raise RequestError(protocol.INVALID_STATE, f"cannot {verb}: not in a run", "join one first: p2ptrain join RUN --peers MULTIADDR")

    # ----- the worker -------------------------------------------------------------

    def _start_worker(self) -> None:
        run_request = self.desired.run
        plan = self._smaller_after_out_of_memory(self._plan(run_request.get("manifest")), run_request.get("manifest") or {})
        spec = {
            "run_id": run_request["run_id"],
            "manifest": run_request.get("manifest"),
            "new_run": bool(run_request.get("new_run")),
            "initial_peers": run_request.get("initial_peers") or self.config.dht.initial_peers,
            "paths": {
                "state_dir": str(self.paths.state_dir),
                "cache_dir": str(self.paths.cache_dir),
                "checkpoints_dir": str(self.paths.checkpoints_dir),
                "identity_key": str(self.paths.identity_key),
            },
            "dht": self.config.dht.model_dump(mode="json"),
            "nickname": self.config.nickname,
            "plan": plan,
            "torch_threads": plan["cpu_threads"] if plan else None,
            "start_paused": self.desired.paused,
            "checkpoint_interval_s": self.config.training.checkpoint_interval_s,
            "log_level": self.config.log_level,
        }
        self.run = RunView(run_id=run_request["run_id"], manifest=run_request.get("manifest") or {})
        self._worker_ran_out_of_memory = False
        self.worker = WorkerHandle(spec, self.paths.worker_pgid_file, self.on_report, self._on_worker_exit)
        self.worker.start()
        if self.desired.paused:
            self._enter(states.PAUSED, "user")
        else:
            self._enter(states.JOINING)

    def _smaller_after_out_of_memory(self, plan: dict | None, manifest: dict) -> dict | None:
        """The plan with the micro-batch halved once per out-of-memory error so
        far (never below one), and grad_accum raised to keep the samples per step.

        Args:
            plan: the hardware plan (None: the worker would use the manifest's hint).
            manifest: the run manifest, for its ``micro_batch_hint``.
        """
        if not self.micro_batch_halvings:
            return plan
        plan = dict(plan or {})
        micro_batch = int(plan.get("micro_batch") or manifest.get("micro_batch_hint") or 1)
        samples_per_step = micro_batch * int(plan.get("grad_accum") or 1)
        smaller = max(1, micro_batch >> self.micro_batch_halvings)
        plan["micro_batch"], plan["grad_accum"] = smaller, max(1, samples_per_step // smaller)
        log.info("plan: micro-batch %d x %d after %d out-of-memory error(s)", smaller, plan["grad_accum"], self.micro_batch_halvings)
        return plan

    def on_report(self, report: dict) -> None:
        kind = report["type"]
        handler = getattr(self, f"_report_{kind}", None)
        if handler is None:
            log.warning("ignoring a worker report of unknown type %r", kind)
            return
        try:
            handler(report)
        except (KeyError, TypeError, ValueError) as error:
            log.warning("ignoring a malformed %s report from the worker: %s", kind, error)

    def _report_joined(self, report: dict) -> None:
        self.run.apply_joined(report)
        self.crashes_in_a_row = 0
        if self.desired.run is not None and report.get("manifest"):
            # Keep the manifest: a restarted daemon can rejoin even if the creator is gone.
            self.desired.run["manifest"] = report["manifest"]
            self._save_desired()
        self.db.record_run_joined(self.run.run_id, report.get("manifest") or {})
        self.record_event("joined", f"joined run {self.run.run_id!r} as {report.get('peer_id')}")
        if self.lifecycle.state == states.JOINING:
            self._enter(states.TRAINING)

    def _report_state(self, report: dict) -> None:
        worker_state = report["state"]
        if worker_state == "finished":
            self.desired.paused = True
            self.desired.pause_until = None
            self._save_desired()
            self.record_event("finished", "finished the epoch; paused")
            self._enter(states.PAUSED, "user")
        elif worker_state == "training" and self.lifecycle.state == states.JOINING:
            self._enter(states.TRAINING)

    def _report_step(self, report: dict) -> None:
        self.run.apply_step(report)
        self.db.record_step(
            self.run.run_id, report.get("epoch"), report.get("loss"), report.get("samples"), report.get("samples_per_second"), ts=report.get("ts")
        )
        self.broadcaster.publish("step", report)

    def _report_epoch(self, report: dict) -> None:
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
        self.broadcaster.publish("epoch", report)

    def _report_swarm(self, report: dict) -> None:
        peers = self.run.apply_swarm(report)
        self.db.record_peers(self.run.run_id, peers)
        self.broadcaster.publish("peers", {"run_id": self.run.run_id, "peers": peers})

    def _report_event(self, report: dict) -> None:
        self.record_event(report["kind"], report.get("message", ""), report.get("data"))

    def _report_error(self, report: dict) -> None:
        message, fix = report.get("message", "training worker error"), report.get("fix", "")
        if report.get("kind") == "oom":
            self._worker_ran_out_of_memory = True
        self.record_event("worker-error", message, {"fix": fix, "fatal": bool(report.get("fatal"))})
        if report.get("fatal"):
            # A fatal error (no such run, bad manifest...) needs the user: stop retrying.
            self.desired = DesiredState()
            self._save_desired()
            self._enter(states.ERROR, error={"message": message, "fix": f"{fix}; then join again (p2ptrain leave clears this error)"})
        else:
            self.run.warnings.append({"level": "warning", "message": message, "fix": fix})

    def _report_left(self, report: dict) -> None:
        self.record_event("left", f"left run {self.run.run_id!r}")

    def _on_worker_exit(self, exitcode: int | None) -> None:
        worker, self.worker = self.worker, None
        if self.desired.run is None:
            if self.lifecycle.state == states.ERROR:
                self.run = RunView()  # the error stays shown until the user leaves or joins again
            else:
                self._left()
            return
        if self._stopping.is_set():
            return
        self.crashes_in_a_row += 1
        delay = RESTART_BACKOFF_S[min(self.crashes_in_a_row, len(RESTART_BACKOFF_S)) - 1]
        self.restart_at = time.monotonic() + delay
        self.run.joined = False
        if self._worker_ran_out_of_memory or exitcode == OUT_OF_MEMORY_EXIT_CODE:
            self.micro_batch_halvings += 1
            plan = (worker.spec.get("plan") if worker is not None else None) or {}
            self.record_event(
                "worker-oom",
                f"training worker ran out of memory; restarting in {delay} s with a smaller micro-batch",
                {"exitcode": exitcode, "restart_in_s": delay, "micro_batch_halvings": self.micro_batch_halvings,
                 "micro_batch": plan.get("micro_batch"), "grad_accum": plan.get("grad_accum")},
            )
            if self.lifecycle.state != states.PAUSED:
                self._enter(states.PAUSED, "oom-backoff")
            return
        self.record_event(
            "worker-crashed",
            f"training worker exited with code {exitcode}; restarting in {delay} s",
            {"exitcode": exitcode, "restart_in_s": delay, "crashes_in_a_row": self.crashes_in_a_row},
        )
        if self.lifecycle.state != states.PAUSED:
            self._enter(states.JOINING)

    def _left(self) -> None:
        if self.run.run_id:
            self.db.record_run_left(self.run.run_id)
        self.run = RunView()
        self._enter(states.IDLE)

    # ----- state, events, status ----------------------------------------------------

    def _enter(self, state: str, pause_reason: str | None = None, error: dict | None = None) -> None:
        if self.lifecycle.enter(state, pause_reason, error):
            log.info("state: %s%s", state, f" ({pause_reason})" if pause_reason else "")
            self.broadcaster.publish("status", self.status())

    def _save_desired(self) -> None:
        self.db.set_setting(DESIRED_STATE_KEY, self.desired.to_dict())

    def record_event(self, kind: str, message: str, data: dict | None = None) -> None:
        ts = time.time()
        log.info("%s: %s", kind, message)
        self.db.record_event(kind, message, data, ts=ts)
        self.broadcaster.publish("event", {"ts": ts, "kind": kind, "message": message, "data": data})

    def one_line_status(self) -> str:
        state = self.lifecycle.state
        if state == states.PAUSED:
            return f"paused ({self.lifecycle.pause_reason})"
        if self.run.run_id and state in (states.TRAINING, states.FINISHING):
            return f"{state} in {self.run.run_id}, epoch {self.run.epoch}, {self.run.num_peers} peers"
        return state

    def health(self) -> list[dict]:
        lines = list(self.run.warnings[-5:]) + self.hardware.health()
        if self.lifecycle.error:
            lines.insert(0, {"level": "error", **self.lifecycle.error})
        if self.db.last_write_error:
            lines.append(
                {"level": "error", "message": f"cannot write the database: {self.db.last_write_error}", "fix": f"free disk space or fix permissions of {self.paths.database}"}
            )
        if self.restart_at is not None:
            lines.append(
                {"level": "warning", "message": f"training worker crashed {self.crashes_in_a_row} time(s) in a row; restarting soon", "fix": "see p2ptrain events and the daemon log"}
            )
        lines.extend(self.run.reachability_health())
        return lines

    def status(self) -> dict:
        return {
            "protocol": protocol.PROTOCOL_VERSION,
            "version": __version__,
            "state": self.lifecycle.state,
            "pause_reason": self.lifecycle.pause_reason,
            "since": self.lifecycle.since,
            "paused_until": self.desired.pause_until,
            "started_at": self.started_at,
            "run": self.run.run_status() if self.run.run_id else None,
            "local": self.run.local_status() if self.run.joined else None,
            "hardware": self.hardware.status(),
            "health": self.health(),
        }
