"""The supervisor: the daemon's collaborators, wired together, and its tick.

One training worker (one peer) per selected GPU, or one on the CPU. The
daemon is a few collaborators with one job each:

- ``RunControl`` (``run_control.py``): the state machine, the desired state
  that survives restarts, and every rule that moves the state (the verbs, the
  volunteer policies, what the workers do);
- ``WorkerPool`` (``worker_pool.py``): the workers' processes, started and
  restarted with back-off (``worker_slots.py`` says which, with what);
- ``RunView`` (``run_view.py``): what the workers reported, shaped for ``status``;
- ``WorkerStates`` (``worker_state.py``, held as ``RunView.states``): each worker's
  state, moved only through its table of allowed moves;
- ``WorkerReports`` (``reports.py``): the handler of each kind of report;
- ``ControlMethods`` (``methods.py``, wired in ``main.py``): the control protocol.

Everything runs in one asyncio event loop: control requests, worker reports
(read from the pipes as they arrive) and a tick every second that ends timed
pauses, restarts workers, applies the volunteer policies, flushes the
database and pings the systemd watchdog. A worker may crash; the daemon
records it and starts that worker again with back-off, and never goes down
with it.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime

from p2ptrain import __version__, protocol
from p2ptrain.control_types import Health, LocalStatus, Push, Status
from p2ptrain.config import Config
from p2ptrain.daemon import state as states
from p2ptrain.daemon.config_file import ConfigFile
from p2ptrain.daemon.event_log import EventLog
from p2ptrain.daemon.hardware_view import HardwareView
from p2ptrain.daemon.notify import SystemdNotifier
from p2ptrain.daemon.policies import CachedSensors, PolicyEngine, SystemSensors
from p2ptrain.daemon.reports import WorkerReports
from p2ptrain.daemon.run_control import RunControl
from p2ptrain.daemon.run_view import RunView
from p2ptrain.daemon.server import Broadcaster
from p2ptrain.daemon.traffic_month import SETTING_KEY as TRAFFIC_MONTH_KEY, MonthlyTraffic
from p2ptrain.daemon.worker_pool import WorkerPool
from p2ptrain.daemon.worker_process import WorkerProcess
from p2ptrain.paths import Paths
from p2ptrain.storage.database import Database
from p2ptrain.worker_pipe import STOP_DEADLINE_S, Report

TICK_S = 1.0
STOP_TIMEOUT_S = 3 * STOP_DEADLINE_S  # the worker gives up its last checkpoint first
DIVERGED_FIX = ("p2ptrain resume trains again from the last good checkpoint (DiLoCo: at a lowered inner learning "
                "rate); if it diverges again, the run's learning rates are too high: its creator can start a new run "
                "with a lower --inner-lr (DiLoCo: or --outer-lr 1.0 --outer-momentum 0)")


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
        self.db = database
        self.notifier = notifier
        self.started_at = time.time()
        self.config = ConfigFile(paths.config_file, config)
        self.traffic_month = MonthlyTraffic(lambda: database.get_setting(TRAFFIC_MONTH_KEY),
                                            lambda value: database.set_setting(TRAFFIC_MONTH_KEY, value))
        self.broadcaster = Broadcaster(lambda: self.status().to_dict())
        self._published_status: Status | None = None
        self.events = EventLog(database, self.broadcaster)
        self.run = RunView()
        self.hardware = HardwareView()
        # the pool calls back (``PoolListener``: worker_report, worker_exited) into the reports and the state
        # machine, which need the pool; the state machine calls back ``state_changed`` (``ControlListener``)
        self.pool = WorkerPool(paths, self.config, self.run, self.events, listener=self)
        self.control = RunControl(database, self.pool, self.run, self.events, listener=self)
        self.reports = WorkerReports(self.run, database, self.broadcaster, self.events, self.control, self.pool,
                                     self.traffic_month)
        # read in a thread: a slow sensor (loginctl) must not hold up the event loop
        self.sensors = CachedSensors(SystemSensors(gpu_index=self.pool.gpu_index(), own_pids=self.pool.pids))
        self.policy = PolicyEngine(config.policy, self.sensors, monthly_traffic_gb=self.traffic_month.used_gb)
        self.config.on_change(self._config_changed)
        self._notified_status = ""
        self._stopping = asyncio.Event()

    # ----- life of the daemon -------------------------------------------------

    async def start(self) -> None:
        """Go back to what the user last asked for (a run, paused or not)."""
        self.events.record("daemon-started", f"p2ptrain {__version__} daemon started")
        self.control.resume_desired()

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
        self._stopping.set()
        self.sensors.close()
        await self.pool.stop_all(STOP_TIMEOUT_S)
        self.events.flush(final=True)
        self.events.record("daemon-stopped", "daemon stopped")
        self.db.close()

    def tick(self) -> None:
        self.control.tick()
        self.hardware.refresh_if_due()
        self.control.apply_policy(self.policy.evaluate())
        self.events.flush()
        self.db.maybe_flush()
        if self.broadcaster.subscribers:
            self._publish_status()
        line = self.one_line_status()
        if line != self._notified_status:
            self.notifier.status(line)
            self._notified_status = line

    def _config_changed(self, config: Config) -> None:
        """Policies apply now; DHT and training settings at the next worker start (the pool reads them then)."""
        self.policy.settings = config.policy

    # ----- what the pool and the state machine ask of the daemon ------------------

    def worker_report(self, name: str, report: Report) -> None:
        """``PoolListener``: a report of current worker ``name``."""
        self.reports.on_report(name, report)

    def worker_exited(self, name: str, process: WorkerProcess, exitcode: int | None) -> None:
        """``PoolListener``: current worker ``name``'s process has ended."""
        self.control.worker_exited(name, process, exitcode)

    def state_changed(self) -> None:
        """``ControlListener``: the daemon's state changed: push the new status now."""
        self._publish_status()

    # ----- status ----------------------------------------------------------------

    def _publish_status(self) -> None:
        """Push the status to subscribers when it changed since the last push: the state at once,
        progress, loss and hardware readings at the next tick (so at most about once a second)."""
        status = self.status()
        if status != self._published_status:
            self._published_status = status
            self.broadcaster.publish(Push.STATUS, status.to_dict())

    def one_line_status(self) -> str:
        state = self.control.lifecycle.state
        if state == states.PAUSED:
            return f"paused ({self.control.lifecycle.pause_reason})"
        if self.run.run_id and state in (states.TRAINING, states.FINISHING):
            return f"{state} in {self.run.run_id}, epoch {self.run.epoch}, {self.run.num_peers} peers"
        return state

    def health(self) -> list[Health]:
        lines = list(self.run.warnings[-5:]) + self.hardware.health()
        if self.control.lifecycle.error:
            lines.insert(0, Health(level="error", **self.control.lifecycle.error))
        if self.db.last_write_error:
            lines.append(Health(level="error", message=f"cannot write the database: {self.db.last_write_error}",
                                fix=f"free disk space or fix permissions of {self.paths.database}"))
        if self.control.desired.run is not None:
            lines.extend(self.pool.crash_health())
        lines.extend(self.run.port_health())
        dht = self.config.config.dht
        lines.extend(self.run.reachability_health(dht.host_maddrs, dht.announce_maddrs))
        if self.control.lifecycle.pause_reason == "diverged":
            lines.append(Health(level="error", message=self.run.divergence or "training diverged again and again: paused",
                                fix=DIVERGED_FIX))
        if self.control.lifecycle.pause_reason == "traffic-budget" and self.policy.detail:
            lines.append(Health(level="warning", message=self.policy.detail,
                                fix="raise it (p2ptrain config set policy.max_monthly_traffic_gb GB) or wait for next month"))
        return lines

    def _local_status(self) -> LocalStatus | None:
        local = self.run.local_status()
        if local is not None:
            local.traffic = self.run.traffic_status(self.traffic_month.used_gb(), datetime.now())
        return local

    def status(self) -> Status:
        """The status object (``control_types.Status``; the ``status`` result is its ``to_dict()``)."""
        return Status(
            protocol=protocol.PROTOCOL_VERSION,
            version=__version__,
            state=self.control.lifecycle.state,
            pause_reason=self.control.lifecycle.pause_reason,
            since=self.control.lifecycle.since,
            paused_until=self.control.desired.pause_until,
            started_at=self.started_at,
            run=self.run.run_status() if self.run.run_id else None,
            local=self._local_status(),
            hardware=self.hardware.status(),
            health=self.health(),
        )
