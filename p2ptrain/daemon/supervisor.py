"""The supervisor: owns the state machine, the training workers and the database.

One training worker (one peer) per selected GPU, or one on the CPU
(``workers.py`` says which and with what). Everything runs in one asyncio
event loop: control requests, worker reports (read from the pipes as they
arrive; ``reports.py`` handles them) and a tick every second that ends timed
pauses, applies the volunteer policies, flushes the database and pings the
systemd watchdog.

The state is the daemon's: join, pause, resume, finish and leave go to every
worker. A worker may crash; the supervisor records it and starts that worker
again with back-off (its own), and never goes down with it. A worker that ran
out of memory is started again with half the micro-batch (and twice the
gradient accumulation, so a step holds as many samples); when no other worker
is training, the daemon shows ``paused (oom-backoff)`` until then.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import Any

from p2ptrain import __version__, protocol
from p2ptrain.config import Config
from p2ptrain.daemon import state as states
from p2ptrain.daemon.hardware_view import HardwareView
from p2ptrain.daemon.notify import SystemdNotifier
from p2ptrain.daemon.policies import PolicyEngine, SystemSensors
from p2ptrain.daemon.reports import WorkerReports
from p2ptrain.daemon.run_view import RunView
from p2ptrain.daemon.server import Broadcaster, RequestError
from p2ptrain.daemon.state import DESIRED_STATE_KEY, DesiredState, Lifecycle
from p2ptrain.daemon.worker_handle import WorkerHandle
from p2ptrain.daemon.workers import (
    WorkerRestarts,
    WorkerSlot,
    restart_delay_s,
    select_devices,
    smaller_after_out_of_memory,
    worker_plan,
    worker_slots,
    worker_spec,
)
from p2ptrain.paths import Paths
from p2ptrain.peers.worker import OUT_OF_MEMORY_EXIT_CODE  # no torch: the worker imports it lazily
from p2ptrain.storage.database import Database

log = logging.getLogger(__name__)

TICK_S = 1.0
STOP_TIMEOUT_S = 90.0


class Daemon(WorkerReports):
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
        self.slots: list[WorkerSlot] = []  # the workers of the current run, first one first
        self.workers: dict[str, WorkerHandle] = {}  # by slot name: the running ones
        self.restarts: dict[str, WorkerRestarts] = {}
        self.policy = PolicyEngine(config.policy, SystemSensors(gpu_index=self._gpu_index(), own_pids=self._worker_pids))
        self.broadcaster = Broadcaster(self.status)
        self._published_status: dict | None = None
        self._notified_status = ""
        self._stopping = asyncio.Event()

    # ----- life of the daemon -------------------------------------------------

    async def start(self) -> None:
        """Go back to what the user last asked for (a run, paused or not)."""
        self.record_event("daemon-started", f"p2ptrain {__version__} daemon started")
        if self.desired.run is not None:
            self._start_workers()

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
        """Orderly stop: the workers checkpoint and exit, the database is flushed."""
        self.notifier.stopping("stopping: checkpointing and flushing")
        self._stopping.set()  # exiting workers are not restarted
        # the workers stay registered while they stop: their last reports (the
        # stop checkpoint) are recorded only from registered workers
        await asyncio.gather(*(worker.stop(STOP_TIMEOUT_S) for worker in list(self.workers.values())))
        self.workers = {}
        self.record_event("daemon-stopped", "daemon stopped")
        self.db.close()

    def tick(self) -> None:
        now = time.time()
        if self.desired.paused and self.desired.pause_until and now >= self.desired.pause_until:
            self.record_event("pause-ended", "timed pause is over; resuming")
            self.resume()
        for slot in self.slots:
            restarts = self.restarts[slot.name]
            if restarts.restart_at is not None and time.monotonic() >= restarts.restart_at and self.desired.run is not None:
                restarts.restart_at = None
                self._start_worker(self._refreshed(slot))
        self.hardware.refresh_if_due()
        self._apply_policies()
        self.db.maybe_flush()
        if self.broadcaster.subscribers:
            self._publish_status()
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
        """The GPU the policies watch (busy, temperature): the first worker's."""
        try:
            device = self._devices()[0]
        except ValueError as error:
            log.warning("no device to train on: %s", error)
            return None
        return device.index if device.kind == "cuda" else None

    def _devices(self):
        """The devices to train on now (free memory as of this probe); ValueError for a bad training.gpus."""
        from p2ptrain.daemon.hardware import probe

        return select_devices(self.config, probe(retries=0))

    def _worker_pids(self) -> set[int]:
        return {worker.pid for worker in self.workers.values() if worker.pid}

    def _plan(self, slot: WorkerSlot, manifest: dict | None) -> dict | None:
        """The hardware plan of one worker, sized from its device's free memory now."""
        plan, failure = worker_plan(slot, manifest, self.config.policy.plan_policy(), self.config.training.uplink_mbit_s)
        if failure:
            self.record_event("plan-failed", f"no hardware plan for {slot.name}: {failure}", {"worker": slot.name})
        for line in (plan or {}).get("rationale") or ():
            log.info("plan %s: %s", slot.name, line)
        return plan

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
        self.record_event("join", f"joining run {run_request['run_id']!r}", {"new_run": run_request.get("new_run", False)})
        self._start_workers()

    def pause(self, reason: str = "user", for_s: float | None = None) -> None:
        self._require_in_run("pause")
        if reason == "user":
            self.desired.paused = True
            self.desired.pause_until = time.time() + for_s if for_s else None
            self._save_desired()
        self._send_all("pause")
        until = f" for {for_s:.0f} s" if for_s else ""
        self.record_event("paused", f"paused ({reason}){until}", {"reason": reason, "for_s": for_s})
        self._enter(states.PAUSED, reason)

    def resume(self) -> None:
        self._require_in_run("resume")
        self.desired.paused = False
        self.desired.pause_until = None
        self._save_desired()
        if self.lifecycle.state in (states.PAUSED, states.FINISHING):
            self._send_all("resume")
            self.record_event("resumed", "resumed training")
            self._enter(states.TRAINING if self.run.joined else states.JOINING)

    def finish(self) -> None:
        self._require_in_run("finish")
        if self.lifecycle.state == states.PAUSED:
            raise RequestError(protocol.INVALID_STATE, "already paused", "resume first: p2ptrain resume")
        self._send_all("finish")
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
        for restarts in self.restarts.values():
            restarts.restart_at = None
        self.record_event("leaving", f"leaving run {run_id!r}")
        if self._send_all("leave"):
            self._enter(states.LEAVING)
        else:
            self._left()

    def _require_in_run(self, verb: str) -> None:
        if self.desired.run is None:
            raise RequestError(protocol.INVALID_STATE, f"cannot {verb}: not in a run", "join one first: p2ptrain join RUN --peers MULTIADDR")

    # ----- the workers ------------------------------------------------------------

    def _send_all(self, command: str) -> bool:
        """Send a command to every running worker; True if at least one got it."""
        return sum(worker.send(command) for worker in self.workers.values()) > 0

    def _start_workers(self) -> None:
        """Start the run's workers, one per selected device (a join, or the daemon's start)."""
        run_request = self.desired.run
        try:
            devices = self._devices()
        except ValueError as error:
            self.desired = DesiredState()
            self._save_desired()
            self.record_event("worker-error", str(error), {"fatal": True})
            self._enter(states.ERROR, error={"message": str(error), "fix": "fix training.gpus (p2ptrain config set training.gpus all), then join again"})
            return
        self.slots = worker_slots(devices, self.paths)
        self.restarts = {slot.name: WorkerRestarts() for slot in self.slots}
        self.run = RunView(run_id=run_request["run_id"], manifest=run_request.get("manifest") or {})
        if len(self.slots) > 1:
            self.record_event("workers", f"one worker per GPU: {', '.join(slot.name for slot in self.slots)}", {"workers": [slot.name for slot in self.slots]})
        for slot in self.slots:
            self._start_worker(slot)
        if self.desired.paused:
            self._enter(states.PAUSED, "user")
        else:
            self._enter(states.JOINING)

    def _start_worker(self, slot: WorkerSlot) -> None:
        """Start (or restart) one worker, with a plan sized from its device's free memory (as last probed)."""
        run_request = self.desired.run
        manifest = run_request.get("manifest") or {}
        restarts = self.restarts[slot.name]
        plan = smaller_after_out_of_memory(self._plan(slot, run_request.get("manifest")), manifest, restarts.micro_batch_halvings)
        if restarts.micro_batch_halvings:
            log.info("plan %s: micro-batch %d x %d after %d out-of-memory error(s)", slot.name, plan["micro_batch"], plan["grad_accum"], restarts.micro_batch_halvings)
        # a worker restarted while a policy holds the others paused starts paused too
        policy_paused = self.lifecycle.state == states.PAUSED and self.lifecycle.pause_reason in states.POLICY_REASONS
        spec = worker_spec(slot, run_request, self.config, self.paths, plan, self.desired.paused or policy_paused, len(self.slots))
        restarts.ran_out_of_memory = False
        self.run.worker(slot.name, slot.device_label).state = "joining"
        name = slot.name
        # the callbacks name their worker: after a fatal error and a quick new
        # join, the old run's workers may still be ending while new ones start
        worker = WorkerHandle(
            spec,
            slot.pgid_file,
            lambda report: self.on_report(name, report) if self.workers.get(name) is worker else None,
            lambda exitcode: self._on_worker_exit(name, worker, exitcode),
            name=name,
        )
        self.workers[slot.name] = worker
        worker.start()
        if self.lifecycle.state == states.FINISHING:
            worker.send("finish")  # the others are finishing their epoch: so does this one
        elif self.lifecycle.state == states.PAUSED and self.lifecycle.pause_reason == "oom-backoff":
            self._enter(states.JOINING)

    def _refreshed(self, slot: WorkerSlot) -> WorkerSlot:
        """The slot with its device probed again (a restart plans from the free memory now)."""
        try:
            devices = self._devices()
        except ValueError:
            return slot
        same = [device for device in devices if (device.kind, device.index) == (slot.device.kind, slot.device.index)]
        return replace(slot, device=same[0]) if same else slot

    def _on_worker_exit(self, name: str, worker: WorkerHandle, exitcode: int | None) -> None:
        if self.workers.get(name) is not worker:
            return  # a worker of an earlier run, which had already been given up on
        del self.workers[name]
        if self.desired.run is None:
            if self.workers:
                return  # the others are still leaving
            if self.lifecycle.state == states.ERROR:
                self.run = RunView()  # the error stays shown until the user leaves or joins again
            else:
                self._left()
            return
        if self._stopping.is_set():
            return
        restarts = self.restarts[name]
        restarts.crashes_in_a_row += 1
        delay = restart_delay_s(restarts.crashes_in_a_row)
        restarts.restart_at = time.monotonic() + delay
        others_training = any(view.joined for other, view in self.run.workers.items() if other != name)
        out_of_memory = restarts.ran_out_of_memory or exitcode == OUT_OF_MEMORY_EXIT_CODE
        self.run.workers[name].stopped("oom-backoff" if out_of_memory else "restarting")
        if out_of_memory:
            restarts.micro_batch_halvings += 1
            plan = worker.spec.get("plan") or {}
            self.record_event(
                "worker-oom",
                f"training worker{self._worker_words(name)} ran out of memory; restarting in {delay} s with a smaller micro-batch",
                {"exitcode": exitcode, "restart_in_s": delay, "micro_batch_halvings": restarts.micro_batch_halvings,
                 "micro_batch": plan.get("micro_batch"), "grad_accum": plan.get("grad_accum"), "worker": name},
            )
            if self.lifecycle.state != states.PAUSED and not others_training:
                self._enter(states.PAUSED, "oom-backoff")
            return
        self.record_event(
            "worker-crashed",
            f"training worker{self._worker_words(name)} exited with code {exitcode}; restarting in {delay} s",
            {"exitcode": exitcode, "restart_in_s": delay, "crashes_in_a_row": restarts.crashes_in_a_row, "worker": name},
        )
        if self.lifecycle.state != states.PAUSED and not others_training:
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
            self._publish_status()

    def _publish_status(self) -> None:
        """Push the status to subscribers when it changed since the last push: the state at once,
        progress, loss and hardware readings at the next tick (so at most about once a second)."""
        status = self.status()
        if status != self._published_status:
            self._published_status = status
            self.broadcaster.publish("status", status)

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
        if self.desired.run is not None:
            lines.extend(self._crash_health())
        lines.extend(self.run.reachability_health())
        return lines

    def _crash_health(self) -> list[dict]:
        """A line per worker that crashed, from the crash until it is back in the swarm (not only until its restart begins)."""
        lines = []
        for name, restarts in self.restarts.items():
            view = self.run.workers.get(name)
            if restarts.crashes_in_a_row and not (view and view.joined):
                lines.append(
                    {"level": "warning", "message": f"training worker{self._worker_words(name)} crashed {restarts.crashes_in_a_row} time(s) in a row; restarting", "fix": "see p2ptrain events and the daemon log"}
                )
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
            "local": self.run.local_status(),
            "hardware": self.hardware.status(),
            "health": self.health(),
        }
