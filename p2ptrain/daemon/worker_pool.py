"""The run's training workers: one per selected device, started, restarted with back-off, told what to do.

``worker_slots.py`` says which workers a run has and what each starts with;
``worker_process.py`` runs one. This module keeps the running ones (by slot
name) and each one's crash and out-of-memory record in this run, so a worker
that crashed is started again after its own back-off, with half the
micro-batch it ran out of memory at (``halved_micro_batch``, the back-off the
worker itself uses before its first step). A pause ends the workers
(``release_all``): they start again at resume. What the daemon's state does
about a crash or a pause is ``run_control.py``'s call.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, replace
from typing import Protocol

from p2ptrain.control_types import Health
from p2ptrain.daemon.config_file import ConfigFile
from p2ptrain.daemon.event_log import EventLog
from p2ptrain.daemon.identity_use import IdentityUse
from p2ptrain.daemon.model_facts import ModelFactsError
from p2ptrain.daemon.plan import DeviceFacts, PlanError, PlanPolicy
from p2ptrain.daemon.run_view import RunView
from p2ptrain.daemon.worker_process import WorkerProcess
from p2ptrain.daemon.worker_slots import (
    WorkerRestarts,
    WorkerSlot,
    hardware_plan,
    restart_delay_s,
    select_devices,
    worker_plan,
    worker_slots,
    worker_spec,
)
from p2ptrain.daemon.worker_state import JOINING, OOM_BACKOFF, PAUSING, RESTARTING
from p2ptrain.paths import Paths
from p2ptrain.worker_pipe import OUT_OF_MEMORY_EXIT_CODE, Command, Error, Pause, Report, UsePlan, WorkerPlan

log = logging.getLogger(__name__)


class NoPlan(Exception):
    """No hardware plan for a worker: ``message`` says why, ``fix`` what to do."""

    def __init__(self, message: str, fix: str):
        super().__init__(message)
        self.message, self.fix = message, fix


class ModelShapeUnknown(NoPlan):
    """The model's ``config.json`` is not on this machine: a worker can fetch it from the hub, then ask again."""


MODEL_SHAPE_FIX = "use the 'tiny' model, or a model directory or hub id whose config.json this machine can read"


class PoolListener(Protocol):
    """What ``WorkerPool`` asks of the daemon (``supervisor.Daemon``), about its current workers only."""

    def worker_report(self, name: str, report: Report) -> None:
        """Worker ``name`` sent ``report``."""

    def worker_exited(self, name: str, process: WorkerProcess, exitcode: int | None) -> None:
        """Worker ``name``'s process has ended (with ``exitcode``)."""


@dataclass(frozen=True)
class WorkerExit:
    """What became of a worker that ended while its run goes on.

    Attributes:
        out_of_memory: it ran out of memory (it said so, or by its exit code);
            its next start has half the micro-batch.
        restart_in_s: its back-off before the next start.
        restarts: its record in this run, already counting this exit.
    """

    out_of_memory: bool
    restart_in_s: int
    restarts: WorkerRestarts


class WorkerPool:
    """The training workers of the run the daemon is in.

    Args:
        paths: the daemon's directories (each worker's files are derived from them).
        config: the daemon's config, read at every start (DHT, training and policy settings).
        run: the run view, where each worker's state (``joining``, ``restarting``...) is kept.
        events: where plan failures and the worker list are recorded.
        listener: told of each report of a current worker, and once a current worker's process has ended.
    """

    def __init__(
        self,
        paths: Paths,
        config: ConfigFile,
        run: RunView,
        events: EventLog,
        listener: PoolListener,
    ):
        self.paths, self.config, self.run, self.events = paths, config, run, events
        self.listener = listener
        self.slots: list[WorkerSlot] = []  # the workers of the current run, first one first
        self.processes: dict[str, WorkerProcess] = {}  # by slot name: the running ones
        self.restarts: dict[str, WorkerRestarts] = {}
        self.identities = IdentityUse()  # for the whole daemon: a worker that returns soon skips hivemind's check
        self.stopping = False  # the daemon is stopping: workers that end are not restarted

    # ----- which devices ---------------------------------------------------------

    def devices(self) -> list[DeviceFacts]:
        """The devices to train on now (free memory as of this probe); ValueError for a bad training.gpus."""
        from p2ptrain.daemon.hardware_probe import probe

        return select_devices(self.config.config, probe(retries=0))

    def gpu_index(self) -> int | None:
        """The GPU the policies watch (busy, temperature): the first worker's."""
        try:
            device = self.devices()[0]
        except ValueError as error:
            log.warning("no device to train on: %s", error)
            return None
        return device.index if device.kind == "cuda" else None

    def pids(self) -> set[int]:
        """The running workers' process ids (the GPU-busy policy does not count them).

        Called from the sensors' thread: it copies the workers first, as the event loop may change them."""
        return {process.pid for process in list(self.processes.values()) if process.pid}

    def worker_words(self, name: str) -> str:
        """' (gpu1)' when there are several workers, so events say which one."""
        return f" ({name})" if len(self.slots) > 1 else ""

    # ----- starting ----------------------------------------------------------------

    def plan_run(self) -> None:
        """Take the run's workers, one per selected device, each with a clean record.

        Raises:
            ValueError: ``training.gpus`` names a GPU this machine does not have.
        """
        self.slots = worker_slots(self.devices(), self.paths)
        self.restarts = {slot.name: WorkerRestarts() for slot in self.slots}
        if len(self.slots) > 1:
            names = [slot.name for slot in self.slots]
            self.events.record("workers", f"one worker per GPU: {', '.join(names)}", {"workers": names})

    def start(self, slot: WorkerSlot, run_request: dict) -> WorkerProcess:
        """Start (or restart) one worker, with a plan sized from its device's free memory (as last probed).

        Without the run's manifest (joining a run) it starts without a plan and asks for one
        once it has read the manifest (``answer_plan``).

        Args:
            slot: the worker.
            run_request: the desired run (``run_id``, ``manifest``, ``new_run``, ``initial_peers``).

        Raises:
            NoPlan: the manifest is known and no plan fits the device (nothing was started).
        """
        manifest = run_request.get("manifest")
        self.run.states.move(slot.name, self.run.worker(slot.name, slot.device_label), JOINING)
        plan = None
        if manifest:
            try:
                plan = self.plan_for(slot, manifest)
            except ModelShapeUnknown:
                pass  # a hub model not fetched yet: the worker fetches its config.json, then asks (PlanWanted)
            except NoPlan as failure:
                self._plan_failed(slot.name, failure)
                raise
        spec = worker_spec(slot, run_request, self.config.config, self.paths, plan, len(self.slots),
                           banned_peers=sorted(self.run.banned),
                           check_identity_free=self.identities.needs_check(str(slot.identity_key)))
        self.restarts[slot.name].ran_out_of_memory = False
        name = slot.name
        # the callbacks name their worker: after a fatal error and a quick new
        # join, the old run's workers may still be ending while new ones start
        process = WorkerProcess(
            spec,
            slot.pgid_file,
            lambda report: self.listener.worker_report(name, report) if self.processes.get(name) is process else None,
            lambda exitcode: self._ended(name, process, exitcode),
            name=name,
        )
        self.processes[name] = process
        process.start()
        return process

    def answer_plan(self, name: str, manifest: dict) -> UsePlan:
        """The answer to worker ``name``'s ``PlanWanted``: its plan for ``manifest``, or why there is none."""
        slot = next((slot for slot in self.slots if slot.name == name), None)
        if slot is None:
            return UsePlan(failure=f"no worker {name} in this run", fix="join the run again")
        try:
            return UsePlan(self.plan_for(self._refreshed(slot), manifest))
        except NoPlan as failure:
            self._plan_failed(name, failure)
            return UsePlan(failure=failure.message, fix=failure.fix)

    def _plan_failed(self, name: str, failure: NoPlan) -> None:
        self.events.record("plan-failed", f"no hardware plan for {name}: {failure.message}", {"worker": name, "fix": failure.fix})

    def plan_for(self, slot: WorkerSlot, manifest: dict) -> WorkerPlan:
        """Worker ``slot``'s plan for ``manifest``, sized from its device's free memory now and capped
        after out-of-memory errors; shown in ``status`` (the run view) and recorded as a ``planned`` event.

        Raises:
            ModelShapeUnknown: the model's config.json is not on this machine.
            NoPlan: the model does not fit the device.
        """
        try:
            plan = hardware_plan(slot, manifest, PlanPolicy.from_settings(self.config.config.policy),
                                 self.config.config.training.uplink_mbit_s, self.paths.cache_dir)
        except ModelFactsError as error:
            raise ModelShapeUnknown(str(error).split("; ")[0], MODEL_SHAPE_FIX) from error
        except PlanError as error:
            raise NoPlan(error.message, error.fix) from error
        restarts = self.restarts[slot.name]
        cap = restarts.micro_batch_cap()
        if cap and plan.micro_batch > cap[0]:
            plan = replace(plan, micro_batch=cap[0], grad_accum=cap[1],
                           rationale=[*plan.rationale, f"micro-batch {cap[0]} x {cap[1]}: ran out of memory at "
                                      f"{restarts.out_of_memory_at[0]} ({restarts.micro_batch_halvings} time(s))"])
        for line in plan.rationale:
            log.info("plan %s: %s", slot.name, line)
        self.run.worker(slot.name, slot.device_label).plan = plan.to_status()
        checkpointing = ", gradient checkpointing" if plan.gradient_checkpointing else ""
        self.events.record(
            "planned", f"plan for {slot.name} ({slot.device.name}): {plan.precision}, quantization {plan.quantization}"
            f"{checkpointing}, micro-batch {plan.micro_batch} x {plan.grad_accum}, ~{plan.memory_estimate_gib} GiB of "
            f"{plan.memory_allowed_gib} GiB allowed", {"worker": slot.name, **plan.to_dict()})
        return worker_plan(slot, plan, max_micro_batch=cap[0] if cap else None)

    def due_restarts(self) -> list[WorkerSlot]:
        """The workers whose back-off is over, each with its device probed again (it plans from the free memory now)."""
        due = []
        for slot in self.slots:
            restarts = self.restarts[slot.name]
            if restarts.restart_at is not None and time.monotonic() >= restarts.restart_at:
                restarts.restart_at = None
                due.append(self._refreshed(slot))
        return due

    def cancel_restarts(self) -> None:
        for restarts in self.restarts.values():
            restarts.restart_at = None

    def stopped_slots(self, names: set[str] | None = None) -> list[WorkerSlot]:
        """The workers with no process (paused, or waiting for a restart), each with its device probed again;
        their pending restarts are cancelled: the caller starts them now.

        Args:
            names: only these workers; None: all.
        """
        stopped = [slot for slot in self.slots if slot.name not in self.processes and (names is None or slot.name in names)]
        for slot in stopped:
            self.restarts[slot.name].restart_at = None
        return [self._refreshed(slot) for slot in stopped]

    def _refreshed(self, slot: WorkerSlot) -> WorkerSlot:
        try:
            devices = self.devices()
        except ValueError:
            return slot
        same = [device for device in devices if (device.kind, device.index) == (slot.device.kind, slot.device.index)]
        return replace(slot, device=same[0]) if same else slot

    # ----- running -------------------------------------------------------------------

    def send_all(self, command: Command) -> bool:
        """Send a command to every running worker; True if at least one got it."""
        return sum(process.send(command) for process in self.processes.values()) > 0

    def joined(self, name: str) -> None:
        """Worker ``name`` is in the swarm again: its crashes are forgiven."""
        self.restarts[name].crashes_in_a_row = 0
        process = self.processes.get(name)
        if process is not None:
            self.identities.joined(process.spec.paths.identity_key)

    def release_all(self) -> None:
        """End every worker for a pause: one in the swarm checkpoints and leaves after its
        current step (``Pause``), one still joining is stopped (SIGTERM). Each is ``pausing`` until it has gone."""
        for name, process in self.processes.items():
            view = self.run.workers[name]
            if view.joined:
                process.send(Pause())
            else:
                process.terminate()
            self.run.states.move(name, view, PAUSING)

    def ran_out_of_memory(self, name: str, report: Error) -> None:
        """Worker ``name`` ran out of memory while training (it exits next): its next start has half its micro-batch."""
        restarts = self.restarts[name]
        restarts.ran_out_of_memory = True
        if report.micro_batch is not None and report.grad_accum is not None:
            restarts.out_of_memory_at = (report.micro_batch, report.grad_accum)

    def _ended(self, name: str, process: WorkerProcess, exitcode: int | None) -> None:
        self.identities.ended(process.spec.paths.identity_key)
        if self.processes.get(name) is not process:
            return  # a worker of an earlier run, which had already been given up on
        del self.processes[name]
        self.listener.worker_exited(name, process, exitcode)

    def schedule_restart(self, name: str, exitcode: int | None, started_with: WorkerPlan | None = None) -> WorkerExit:
        """Count the exit of worker ``name`` and set its restart after its back-off.

        ``started_with``: the plan its process was started with; when it ran out of memory before
        it could report at which micro-batch, its next start halves that one."""
        restarts = self.restarts[name]
        restarts.crashes_in_a_row += 1
        delay = restart_delay_s(restarts.crashes_in_a_row)
        restarts.restart_at = time.monotonic() + delay
        out_of_memory = restarts.ran_out_of_memory or exitcode == OUT_OF_MEMORY_EXIT_CODE
        if out_of_memory:
            restarts.micro_batch_halvings += 1
            if not restarts.ran_out_of_memory and started_with is not None and started_with.micro_batch:
                restarts.out_of_memory_at = (started_with.micro_batch, started_with.grad_accum)
        view = self.run.workers[name]
        view.stopped()
        self.run.states.move(name, view, OOM_BACKOFF if out_of_memory else RESTARTING)
        return WorkerExit(out_of_memory, delay, restarts)

    def crash_health(self) -> list[Health]:
        """A line per worker that crashed, from the crash until it is back in the swarm (not only until its restart begins)."""
        lines = []
        for name, restarts in self.restarts.items():
            view = self.run.workers.get(name)
            if restarts.crashes_in_a_row and not (view and view.joined):
                lines.append(Health(level="warning", message=f"training worker{self.worker_words(name)} crashed "
                                    f"{restarts.crashes_in_a_row} time(s) in a row; restarting",
                                    fix="see p2ptrain events and the daemon log"))
        return lines

    async def stop_all(self, timeout_s: float) -> None:
        """Ask every worker to checkpoint and exit; none is restarted from now on.

        The workers stay registered while they stop: their last reports (the
        stop checkpoint) are handled only from registered workers.
        """
        self.stopping = True
        await asyncio.gather(*(process.stop(timeout_s) for process in list(self.processes.values())))
        self.processes = {}
