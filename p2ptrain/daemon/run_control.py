"""The daemon's state machine: what the user asked for, the state now, and every rule that moves it.

The verbs (join, pause, resume, finish, leave, unban), the volunteer policies, a
timed pause running out, and what the workers do (join the swarm, finish an
epoch, fail, exit) all change the state here, and only here. The desired
state (``state.py``) is saved at every change, so a restarted daemon goes
back to it. Verbs go to every worker; the state is the daemon's: ``joining``
becomes ``training`` when the first worker joins, ``finish`` pauses once every
running worker has finished its epoch, and a crash changes the state only
when no other worker is in the swarm.

A pause, the user's or a policy's, ends the workers (each checkpoints and
leaves the swarm first), so a paused daemon holds no training memory and no
peer of it takes part in matchmaking; ``resume`` starts them again from their
checkpoints. No worker starts while the daemon is paused: not after a crash,
not when the daemon itself starts paused. The policies' hold times
(``policy.min_pause_s``, ``resume_after_s``) bound how often a flapping
condition can make the workers rejoin.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from typing import Any, Protocol

from p2ptrain import protocol
from p2ptrain.daemon import state as states
from p2ptrain.daemon.event_log import EventLog
from p2ptrain.daemon.run_view import RunView
from p2ptrain.daemon.server import RequestError
from p2ptrain.daemon.state import DESIRED_STATE_KEY, PAUSED_VIEW_KEY, DesiredState, Lifecycle
from p2ptrain.daemon.worker_pool import NoPlan, WorkerPool
from p2ptrain.daemon.worker_process import WorkerProcess
from p2ptrain.daemon.worker_slots import WorkerSlot
from p2ptrain.daemon.worker_state import FINISHED, PAUSED, PAUSING, WorkerState
from p2ptrain.storage.bans import banned_peers, lift_bans
from p2ptrain.storage.database import Database
from p2ptrain.worker_pipe import Finish, Leave, Resume, Unban

log = logging.getLogger(__name__)


class ControlListener(Protocol):
    """What ``RunControl`` asks of the daemon (``supervisor.Daemon``)."""

    def state_changed(self) -> None:
        """The daemon's state changed (the daemon pushes a new status)."""


class RunControl:
    """Keeps ``lifecycle`` (the state now) and ``desired`` (what the user asked for), and moves them.

    Args:
        db: where the desired state is saved, and runs joined and left are recorded.
        pool: the run's workers, which the verbs start and command.
        run: the run view, reset when a run starts or ends.
        events: where every change is recorded.
        listener: told after every change of state.

    It listens to the workers' states (``run.states``): a move may change the daemon's paused view.
    """

    def __init__(self, db: Database, pool: WorkerPool, run: RunView, events: EventLog, listener: ControlListener):
        self.db, self.pool, self.run, self.events = db, pool, run, events
        self.listener = listener
        self.lifecycle = Lifecycle()
        self.desired = DesiredState.from_dict(db.get_setting(DESIRED_STATE_KEY))
        run.states.listener = self

    # ----- verbs -----------------------------------------------------------------

    def join(self, run_request: dict[str, Any]) -> None:
        """Join (or create) a run: ``run_id``, ``initial_peers``, ``new_run``, ``manifest``."""
        if self.lifecycle.state in states.IN_RUN or self.lifecycle.state == states.LEAVING:
            raise RequestError(
                protocol.INVALID_STATE,
                f"already in run {self.run.run_id!r} ({self.lifecycle.state})",
                "leave it first: p2ptrain leave",
            )
        self.desired = DesiredState(run=run_request)
        self._save_desired()
        self.events.record("join", f"joining run {run_request['run_id']!r}", {"new_run": run_request.get("new_run", False)})
        self._start_workers()

    def pause(self, reason: str = "user", for_s: float | None = None) -> None:
        """End every worker, each once it has checkpointed; a ``user`` pause (for ``for_s``
        seconds, or until resumed) and a ``diverged`` one are kept across restarts."""
        self._require_in_run("pause")
        if reason in ("user", "diverged"):
            self.desired.paused = True
            self.desired.pause_until = time.time() + for_s if for_s else None
            self.desired.pause_reason = None if reason == "user" else reason
            self._save_desired()
        self.pool.release_all()
        until = f" for {for_s:.0f} s" if for_s else ""
        self.events.record("paused", f"paused ({reason}){until}", {"reason": reason, "for_s": for_s})
        self._enter(states.PAUSED, reason)

    def resume(self) -> None:
        """Train again: cancel a finish, or start the workers a pause ended (from their checkpoints)."""
        self._require_in_run("resume")
        self.desired.paused = False
        self.desired.pause_until = None
        self.desired.pause_reason = None
        self._save_desired()
        if self.lifecycle.state == states.FINISHING:
            self.pool.send_all(Resume())
        elif self.lifecycle.state != states.PAUSED:
            return
        self.events.record("resumed", "resumed training")
        self._enter(states.TRAINING if self.run.joined else states.JOINING)
        # a worker still pausing (finishing its step) starts again once it has gone: worker_exited
        for slot in self.pool.stopped_slots():
            self._start_worker(slot)

    def finish(self) -> None:
        """Complete the current epoch, then pause."""
        self._require_in_run("finish")
        if self.lifecycle.state == states.PAUSED:
            raise RequestError(protocol.INVALID_STATE, "already paused", "resume first: p2ptrain resume")
        self.pool.send_all(Finish())
        self.events.record("finishing", "finishing the current epoch, then pausing")
        self._enter(states.FINISHING)

    def leave(self) -> None:
        if self.lifecycle.state == states.ERROR and self.desired.run is None:
            # Leaving after a fatal error only acknowledges it.
            self.events.record("left", "error acknowledged; idle")
            self._left()
            return
        self._require_in_run("leave")
        run_id = self.desired.run["run_id"] if self.desired.run else self.run.run_id
        self.desired = DesiredState()
        self._save_desired()
        self.pool.cancel_restarts()
        self.events.record("leaving", f"leaving run {run_id!r}")
        if self.pool.send_all(Leave()):
            self._enter(states.LEAVING)
        else:
            self._left()

    def unban(self, peer_ids: list[str] | None) -> list[str]:
        """Lift this machine's bans of ``peer_ids`` (all when None) in the current run, in the
        database and in the running workers; returns the peer ids lifted."""
        run_id = self.desired.run["run_id"] if self.desired.run else self.run.run_id
        if not run_id:
            raise RequestError(protocol.INVALID_STATE, "cannot unban: not in a run", "join one first: p2ptrain join RUN --peers MULTIADDR")
        try:
            lifted = lift_bans(self.db, run_id, peer_ids)
        except sqlite3.Error as error:
            raise RequestError(protocol.INTERNAL, f"cannot write the database {self.db.path}: {error}", "free disk space or fix its permissions")
        if peer_ids is not None and not lifted:
            raise RequestError(protocol.BAD_REQUEST, f"{', '.join(peer_ids)} is not banned in run {run_id!r}",
                               "p2ptrain peers lists the banned peers")
        self.run.banned -= set(lifted)
        self.pool.send_all(Unban(peers=peer_ids))
        self.events.record("peers-unbanned", f"lifted the ban of {len(lifted)} peer{'s' if len(lifted) != 1 else ''} in run {run_id!r}",
                           {"peers": lifted})
        return lifted

    def _require_in_run(self, verb: str) -> None:
        if self.desired.run is None:
            raise RequestError(protocol.INVALID_STATE, f"cannot {verb}: not in a run", "join one first: p2ptrain join RUN --peers MULTIADDR")

    # ----- the clock and the policies --------------------------------------------------

    def resume_desired(self) -> None:
        """At the daemon's start: go back to what the user last asked for (a run, paused or not)."""
        if self.desired.run is not None:
            self._start_workers()

    def tick(self) -> None:
        """End a timed pause that is over, and start the workers whose back-off is over (unless paused)."""
        if self.desired.paused and self.desired.pause_until and time.time() >= self.desired.pause_until:
            self.events.record("pause-ended", "timed pause is over; resuming")
            self.resume()
        if self.desired.run is not None and not self.holding():
            for slot in self.pool.due_restarts():
                self._start_worker(slot)

    def holding(self) -> bool:
        """Paused for a reason that keeps the workers ended (any but ``oom-backoff``, which waits for a restart)."""
        return self.lifecycle.state == states.PAUSED and self.lifecycle.pause_reason != states.OOM_BACKOFF

    def apply_policy(self, reason: str | None) -> None:
        """Follow the volunteer policies: ``reason`` is the pause reason that holds now, or None."""
        state = self.lifecycle.state
        if reason and state in (states.TRAINING, states.JOINING, states.FINISHING):
            self.pause(reason)
        elif reason and state == states.PAUSED and self.lifecycle.pause_reason != reason and not self.desired.paused:
            self._enter(states.PAUSED, reason)
        elif not reason and state == states.PAUSED and self.lifecycle.pause_reason in states.POLICY_REASONS and not self.desired.paused:
            self.resume()

    # ----- the workers ------------------------------------------------------------------

    def _start_workers(self) -> None:
        """Start the run's workers, one per selected device (a join, or the daemon's start)."""
        run_request = self.desired.run
        try:
            self.pool.plan_run()
        except ValueError as error:
            self.desired = DesiredState()
            self._save_desired()
            self.events.record("worker-error", str(error), {"fatal": True})
            self._enter(states.ERROR, error={"message": str(error), "fix": "fix training.gpus (p2ptrain config set training.gpus all), then join again"})
            return
        self.run.reset(run_request["run_id"], run_request.get("manifest") or {})
        self.run.banned = {ban["peer_id"] for ban in banned_peers(self.db, self.run.run_id)}
        if self.desired.paused:
            # the daemon started paused: no worker, the run as it was last seen
            self._restore_paused_view()
            self._enter(states.PAUSED, self.desired.pause_reason or "user")
            return
        for slot in self.pool.slots:
            if not self._start_worker(slot):
                return
        self._enter(states.JOINING)

    def _restore_paused_view(self) -> None:
        for slot in self.pool.slots:
            self.run.states.move(slot.name, self.run.worker(slot.name, slot.device_label), PAUSED)
        snapshot = self.db.get_setting(PAUSED_VIEW_KEY)
        if isinstance(snapshot, dict) and snapshot.get("run_id") == self.run.run_id:
            try:
                self.run.restore(snapshot, PAUSED)
            except (KeyError, TypeError, ValueError) as error:
                log.warning("not showing the run as last seen: its record is unreadable (%s)", error)

    def _start_worker(self, slot: WorkerSlot) -> bool:
        """Start one worker; False when no hardware plan fits its device (then the daemon is in ``error``)."""
        try:
            process = self.pool.start(slot, self.desired.run)
        except NoPlan as failure:
            self.worker_failed(f"no hardware plan for {slot.name}: {failure.message}", failure.fix)
            if not self.pool.processes:
                self.run.reset()  # no worker will end and drop the run: the error stays shown until leave
            return False
        if self.lifecycle.state == states.FINISHING:
            process.send(Finish())  # the others are finishing their epoch: so does this one
        elif self.lifecycle.state == states.PAUSED and self.lifecycle.pause_reason == states.OOM_BACKOFF:
            self._enter(states.JOINING)
        return True

    def worker_joined(self, manifest: dict) -> None:
        """A worker is in the swarm with ``manifest``."""
        if self.desired.run is not None and manifest:
            # Keep the manifest: a restarted daemon can rejoin even if the creator is gone.
            self.desired.run["manifest"] = manifest
            self._save_desired()
        if self.lifecycle.state == states.JOINING:
            self._enter(states.TRAINING)

    def worker_state(self, worker_state: str, reason: str | None = None) -> None:
        """A worker reported its state (the run view has it already); ``reason``: why it paused on its own."""
        if reason == "diverged" and self.lifecycle.state != states.PAUSED:
            # its training diverged again and again: the run's settings, not bad luck, so the other
            # workers stop too, until the volunteer resumes
            self.pause("diverged")
            return
        if worker_state == FINISHED:
            # every running worker completes its epoch before the daemon pauses
            if any(self.run.workers[name].state != FINISHED for name in self.pool.processes):
                return
            self.desired.paused = True
            self.desired.pause_until = None
            self._save_desired()
            self.events.record("finished", "finished the epoch; paused")
            self._enter(states.PAUSED, "user")
        elif worker_state == WorkerState.TRAINING and self.lifecycle.state == states.JOINING:
            self._enter(states.TRAINING)

    def worker_failed(self, message: str, fix: str) -> None:
        """A worker had a fatal error (no such run, a bad manifest...): it needs the user, so stop
        retrying and end the other workers."""
        self.desired = DesiredState()
        self._save_desired()
        self.pool.send_all(Leave())
        self._enter(states.ERROR, error={"message": message, "fix": f"{fix}; then join again (p2ptrain leave clears this error)"})

    def worker_exited(self, name: str, process: WorkerProcess, exitcode: int | None) -> None:
        """Worker ``name`` has ended: the run is over, or it is restarted after its back-off."""
        if self.desired.run is None:
            if self.pool.processes:
                return  # the others are still leaving
            if self.lifecycle.state == states.ERROR:
                self.run.reset()  # the error stays shown until the user leaves or joins again
            else:
                self._left()
            return
        if self.pool.stopping:
            return
        view = self.run.workers[name]
        released = exitcode == 0 and view.state in (PAUSING, PAUSED, FINISHED)
        if released or self.holding():
            self._released(name, finished=released and view.state == FINISHED)
            return
        ended = self.pool.schedule_restart(name, exitcode, process.spec.plan)
        others_training = any(view.joined for other, view in self.run.workers.items() if other != name)
        words = self.pool.worker_words(name)
        if ended.out_of_memory:
            plan = process.spec.plan
            micro_batch, grad_accum = ended.restarts.out_of_memory_at or (plan.micro_batch, plan.grad_accum)
            self.events.record(
                "worker-oom",
                f"training worker{words} ran out of memory; restarting in {ended.restart_in_s} s with a smaller micro-batch",
                {"exitcode": exitcode, "restart_in_s": ended.restart_in_s, "micro_batch_halvings": ended.restarts.micro_batch_halvings,
                 "micro_batch": micro_batch, "grad_accum": grad_accum, "worker": name},
            )
            if self.lifecycle.state != states.PAUSED and not others_training:
                self._enter(states.PAUSED, states.OOM_BACKOFF)
            return
        self.events.record(
            "worker-crashed",
            f"training worker{words} exited with code {exitcode}; restarting in {ended.restart_in_s} s",
            {"exitcode": exitcode, "restart_in_s": ended.restart_in_s, "crashes_in_a_row": ended.restarts.crashes_in_a_row, "worker": name},
        )
        if self.lifecycle.state != states.PAUSED and not others_training:
            self._enter(states.JOINING)

    def _released(self, name: str, finished: bool) -> None:
        """Worker ``name`` has ended for a pause (or a finish that completed its epoch)."""
        view = self.run.workers[name]
        view.stopped()
        self.run.states.move(name, view, FINISHED if finished else PAUSED)  # the paused view is saved: worker_moved
        if self.holding() or (finished and self.lifecycle.state == states.FINISHING):
            return
        # resumed while it was still finishing its step: it starts again now
        for slot in self.pool.stopped_slots({name}):
            self._start_worker(slot)

    def worker_moved(self, name: str, before: WorkerState, after: WorkerState) -> None:
        """A worker's state moved (``worker_state.WorkerStateListener``)."""
        self._keep_paused_view(after)

    def _keep_paused_view(self, worker_state: WorkerState | None = None) -> None:
        """Save what ``status`` shows of the run while paused, for a restart of the daemon (``_restore_paused_view``).

        The one place it is saved: at every change of the daemon's state or of a worker's while paused
        (a worker's last one comes once it has checkpointed and ended, with the totals of its last step
        report), and when a worker finished its epoch after a ``finish``.

        Args:
            worker_state: the state a worker just moved to; None: the daemon's state changed.
        """
        if self.holding() or (worker_state == FINISHED and self.lifecycle.state == states.FINISHING):
            self.db.set_setting(PAUSED_VIEW_KEY, self.run.snapshot())

    def _left(self) -> None:
        self.db.set_setting(PAUSED_VIEW_KEY, None)
        if self.run.run_id:
            self.db.record_run_left(self.run.run_id)
        self.run.reset()
        self._enter(states.IDLE)

    # ----- the state --------------------------------------------------------------------

    def _enter(self, state: str, pause_reason: str | None = None, error: dict | None = None) -> None:
        if self.lifecycle.enter(state, pause_reason, error):
            log.info("state: %s%s", state, f" ({pause_reason})" if pause_reason else "")
            self._keep_paused_view()
            self.listener.state_changed()

    def _save_desired(self) -> None:
        self.db.set_setting(DESIRED_STATE_KEY, self.desired.to_dict())
