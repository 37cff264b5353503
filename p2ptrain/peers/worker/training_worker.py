"""The training worker: one process (torch + hivemind) that the daemon starts with ``spawn``.

``main(conn, spec)`` joins a run, trains, and talks to the daemon over ``conn``
(commands down, reports up: see "Worker pipe" in DEVELOPERS.md). It leads its
own process group and dies with the daemon (PR_SET_PDEATHSIG); on SIGTERM it
checkpoints and ends everything it started (DHT process, averagers, p2pd).

A worker lives from join to pause: ``pause`` (and ``finish``, once its epoch
is complete) checkpoints, leaves the swarm and ends the process, so the memory
of the model, its gradients, the optimizer and the CUDA context all go back to
the volunteer; the daemon's ``resume`` starts a new worker from that checkpoint.
A worker started without a plan (joining a run: the daemon had no manifest)
asks the daemon for one once it has read the manifest (``device_setup``).
Before its first step the worker holds its GPU allocator to the plan's cap and
confirms its micro-batch with real passes (``calibration``), halving it on
out-of-memory and growing it while larger ones are faster.
"""

from __future__ import annotations

import faulthandler
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from pathlib import Path

from p2ptrain import processes
from p2ptrain.peers.training.divergence import Divergence, DivergenceGuard
from p2ptrain.peers.worker.command_inbox import CommandInbox
from p2ptrain.peers.worker.duty_cycle import DutyCycle
from p2ptrain.peers.worker.out_of_memory import is_out_of_memory
from p2ptrain.peers.worker.known_peers import peers_file, remember_peers
from p2ptrain.peers.worker.run_setup import WorkerFailure, join_dht, load_data, load_model, make_trainer, run_manifest
from p2ptrain.peers.training.trainer import Trainer
from p2ptrain.worker_pipe import (
    DAEMON_GONE_DEADLINE_S, FAILED_EXIT_CODE, OUT_OF_MEMORY_EXIT_CODE, STOP_DEADLINE_EXIT_CODE, STOP_DEADLINE_S,
    Command, Epoch, Error, Event, Finish, Joined, Leave, Left, MalformedMessage, Pause, Report, Resume, StateChanged,
    Step, Unban, UsePlan, WorkerPlan, WorkerSpec, encode, halved_micro_batch,
)

logger = logging.getLogger(__name__)

STEP_REPORT_INTERVAL_S = 1.0
# each publish and read is DHT traffic on a volunteer's metered line (peers/training/progress.py has the numbers):
# the swarm view is read every 15 s, our metrics record (expiring after 90 s) written every 30 s
SWARM_REPORT_INTERVAL_S = 15.0
METRICS_INTERVAL_S = 30.0
# after the stop checkpoint, hivemind's goodbye (progress record, averagers, DHT) gets this long: its
# optimizer can wait out a whole averaging timeout there for a round nobody comes to
GOODBYE_TIMEOUT_S = 5.0


class Stopped(KeyboardInterrupt):
    """SIGTERM arrived while the worker was blocked outside the training loop."""


def main(conn, spec_dict: dict) -> None:
    """Entry point of the worker process (see the module docstring).

    Args:
        conn: this end of the pipe to the daemon.
        spec_dict: a ``WorkerSpec`` in its dict form (``WorkerSpec.to_dict``).
    """
    pgid = processes.become_group_leader()
    processes.die_with_parent()
    try:
        spec = WorkerSpec.from_dict(spec_dict)
    except MalformedMessage as error:
        conn.send(encode(Error(f"bad worker spec: {error}", "a bug in the daemon: report it with the daemon log", fatal=True)))
        os._exit(FAILED_EXIT_CODE)
    # a spawned child inherits "spawn" as its default start method, but
    # hivemind's averagers are plain mp.Process objects that must be forked
    multiprocessing.set_start_method("fork", force=True)
    logging.basicConfig(
        level=getattr(logging, spec.log_level.upper(), logging.INFO),
        format="%(asctime)s worker[%(process)d] %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # `kill -USR1 <worker pid>` writes every thread's stack to the log: for a stuck worker
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    worker = Worker(conn, spec, pgid)
    processes.install_stop_handlers(worker.on_signal)
    # hivemind's DHT and averager processes are forked from here: they must die
    # on the group's SIGTERM, not run the worker's handler
    os.register_at_fork(after_in_child=processes.default_stop_handlers)
    exit_code = 0
    try:
        worker.start()
        worker.run()
    except Stopped:
        logger.info("Stopped by a signal")
    except WorkerFailure as failure:
        worker.report(Error(failure.message, failure.fix, fatal=True))
        exit_code = FAILED_EXIT_CODE
    except Exception as error:
        if worker.stop_requested:
            # ending the group under a busy step can break what it was using (a pipe, shared memory)
            logger.info("Stopped by a signal during a step (%s: %s)", type(error).__name__, error)
        elif isinstance(error, MemoryError) or is_out_of_memory(error):
            logger.exception("The training worker ran out of memory")
            exit_code = worker.report_out_of_memory(error)
        else:
            logger.exception("The training worker failed")
            worker.report(Error(f"training worker failed: {error}", "see the worker log; the daemon restarts the worker", fatal=True))
            exit_code = FAILED_EXIT_CODE
    finally:
        worker.close()
        # hivemind's processes were asked to shut down by close(); p2pd and the
        # rest get a short grace when the daemon is gone and no one waits for them
        grace_s = 1.0 if worker.daemon_gone() else 3.0
        ending_started = time.monotonic()
        processes.kill_descendants(grace_s)
        processes.kill_own_group(pgid, grace_s)
        logger.info("Worker processes ended in %.1f s", time.monotonic() - ending_started)
    # hivemind's atexit hooks would wait for processes we already ended
    os._exit(exit_code)


class Worker:
    """Holds one run's DHT, model, data and trainer, and the loop that drives them."""

    def __init__(self, conn, spec: WorkerSpec, pgid: int):
        """``conn``: the pipe to the daemon; ``spec``: what to run; ``pgid``: the
        process group this worker leads."""
        self.conn, self.spec, self.pgid = conn, spec, pgid
        self.daemon_pid = os.getppid()
        self.send_lock = threading.Lock()
        self.stop_requested = False
        self.interruptible = True  # a signal may interrupt setup, never a training step
        self.dht = self.network = self.loaded = self.batches = None
        self.trainer: Trainer | None = None
        self.state = "joining"
        self.finish_at_epoch: int | None = None
        self.plan: WorkerPlan | None = spec.plan  # the daemon's, at once or once the manifest is read
        self.kept_commands: list[Command] = []  # received while waiting for the plan, for the loop
        self.inbox: CommandInbox | None = None  # reads the pipe from the loop's start (``run``)
        self.micro_batch: int | None = None  # known once the plan is read; confirmed by calibration
        self.last_loss: float | None = None
        self.samples_per_second = 0.0
        self.last_round_group = 0  # peers in the last averaging round that finished (its metrics record's last_group)
        self.metrics_place = (1, 0)  # the shard of the run's records its metrics record was last published in
        self.peer_id = ""
        self.left = False
        self.guard = DivergenceGuard()
        self.duty = DutyCycle(1.0)  # the plan's compute share, once the plan is read
        self.rest_s = 0.0  # the duty cycle's rest after the last step: not idle time
        self.command_handlers = {Pause: self.on_pause, Resume: self.on_resume, Finish: self.on_finish, Leave: self.leave, Unban: self.on_unban,
                                 UsePlan: self.on_use_plan}

    # --- pipe ---------------------------------------------------------
    def report(self, report: Report) -> None:
        try:
            with self.send_lock:
                self.conn.send(encode(report))
        except (BrokenPipeError, OSError, EOFError):
            logger.warning("The daemon is gone; could not send %s", report.KIND)

    def event(self, kind: str, message: str, **data) -> None:
        # the daemon logs it, repeats folded into one line (daemon/event_log.py): here only when debugging
        logger.debug("%s: %s", kind, message)
        self.report(Event(kind, message, data))

    def report_out_of_memory(self, error: BaseException) -> int:
        """Report an out-of-memory error while training; returns the exit code.

        Not fatal while the micro-batch can be halved: the daemon restarts the
        worker with ``halved_micro_batch``. At micro-batch 1, or before the model
        was even built, nothing smaller would fit: a fatal error for the volunteer.
        """
        from p2ptrain.peers.worker.calibration import out_of_memory_failure

        if self.micro_batch is None or halved_micro_batch(self.micro_batch, self.grad_accum) is None:
            model = self.manifest.model if getattr(self, "manifest", None) else "the run's model"
            failure = out_of_memory_failure(model, self.device, error, self.micro_batch)
            self.report(Error(failure.message, failure.fix, fatal=True, out_of_memory=True, micro_batch=self.micro_batch))
            return FAILED_EXIT_CODE
        self.report(Error(f"out of memory at micro-batch {self.micro_batch}: {error}", "the daemon retries with a smaller micro-batch",
                          out_of_memory=True, micro_batch=self.micro_batch, grad_accum=self.grad_accum))
        return OUT_OF_MEMORY_EXIT_CODE

    def daemon_gone(self) -> bool:
        return os.getppid() != self.daemon_pid

    def on_signal(self, signum, frame) -> None:
        logger.info("Received signal %d: checkpointing and stopping", signum)
        if not self.stop_requested:
            self.stop_requested = True
            deadline = DAEMON_GONE_DEADLINE_S if self.daemon_gone() else STOP_DEADLINE_S
            timer = threading.Timer(deadline, self._stop_now, args=(deadline,))
            timer.daemon = True
            timer.start()
            if not self.interruptible and self.trainer is not None:
                # the step may wait for a round whose peers stop too (a swarm stopped at once) or are
                # gone (a peer left alone): let go of it, so the step ends and the checkpoint is taken
                # (not from this handler: it runs on the main thread, inside that wait)
                threading.Thread(target=self._abandon_rounds, args=(self.trainer,), name="abandon-rounds", daemon=True).start()
        if self.interruptible:
            raise Stopped()

    @staticmethod
    def _abandon_rounds(trainer: Trainer) -> None:
        try:
            trainer.abandon_rounds(without_group=False)
        except Exception:
            logger.exception("Could not cancel the averaging rounds in flight; the stop waits for them")

    def _stop_now(self, deadline: float) -> None:
        """Runs on a timer thread when the main thread did not stop within ``deadline`` seconds."""
        logger.warning("Still busy %.0f s after the stop signal (averaging?): ending without a final checkpoint", deadline)
        # past the deadline nothing is worth a grace period: SIGKILL at once
        processes.kill_descendants(grace_s=0)
        processes.kill_own_group(self.pgid, grace_s=0)
        os._exit(STOP_DEADLINE_EXIT_CODE)

    # --- setup --------------------------------------------------------
    def start(self) -> None:
        """Join the run: DHT, manifest, model, data, trainer (``run_setup``), the checkpoint, then report ``joined``."""
        import torch

        from p2ptrain.peers.net.network import PeerNetwork
        from p2ptrain.peers.net.traffic import TrafficMeter
        from p2ptrain.peers.worker.device_setup import cap_gpu_memory, check_device, wait_for_plan
        from p2ptrain.peers.net.dht import port_moves

        spec = self.spec
        self.device = spec.plan.device if spec.plan else "cpu"  # until the plan says
        meter = TrafficMeter()
        meter.install()  # before the DHT and averager processes fork: they count into it
        self.dht = join_dht(spec, peers_file(self._checkpoint_file()))
        self.port_moves = port_moves(self.dht)
        for move in self.port_moves:
            details = {name: value for name, value in move.to_dict().items() if name != "message"}
            self.event("port-taken", move.message, **details)
        # measured while the model loads, taken before the averagers start: their role (reducer or client) follows it
        self.network = PeerNetwork(self.dht, self.report, client_mode=spec.dht.client_mode, meter=meter)
        self.network.start_join()
        self.manifest = manifest = run_manifest(spec, self.dht)
        if self.plan is None:
            self.plan = wait_for_plan(self.conn, self.report, manifest.model_dump(mode="json"), self.kept_commands)
        plan = self.plan
        check_device(plan)
        cap_gpu_memory(plan)
        if plan.cpu_threads:
            torch.set_num_threads(plan.cpu_threads)
        self.device, self.precision, self.quantization = plan.device, plan.precision, plan.quantization
        self.grad_accum = plan.grad_accum
        self.duty = DutyCycle(plan.compute_share)
        self.manifest_hash = manifest.manifest_hash()
        self.peer_id = self.dht.peer_id.to_base58()
        checkpoint = self._read_checkpoint()
        start_position = int(checkpoint.get("data_position", 0)) if checkpoint else 0
        self.loaded = load_model(manifest, self.device, self.precision, self.quantization, plan.gradient_checkpointing)
        self.micro_batch = plan.micro_batch or manifest.micro_batch_hint
        self.calibration = self._confirm_micro_batch()
        self.batches, self.validation = load_data(manifest, self.loaded.tokenizer, self.micro_batch, self.peer_id, Path(spec.paths.cache_dir), start_position)
        if checkpoint:
            try:
                self.loaded.load_trainable_state(checkpoint["trainable"])
            except (KeyError, ValueError) as error:
                self.event("checkpoint-ignored", f"checkpoint not used: {error}")
                checkpoint = None
        self.network.finish_join()
        self.trainer = make_trainer(spec, plan, manifest, self.dht, self.loaded.trainable(), self.micro_batch * self.grad_accum,
                                    averaging_client=self.network.averaging_client)
        # hivemind's averagers set SIGINT to ignored when they start
        processes.install_stop_handlers(self.on_signal)
        if checkpoint:
            self.trainer.account.load_dict(checkpoint)
            self.trainer.load_state_dict(checkpoint["trainer"])
            self.guard.load_state_dict(checkpoint.get("divergence"))
            carried = self.trainer.pending_samples
            # pending at the save, but not in the restored state (a checkpoint of an older p2ptrain): lost
            self.trainer.account.add_unused("late", max(0, self.trainer.account.pending - carried))
            kept = f", with the gradients of {carried} samples for the next round" if carried else ""
            self.event("checkpoint-loaded", f"resumed from a checkpoint at epoch {self.trainer.local_epoch}{kept}",
                       epoch=self.trainer.local_epoch, pending_samples=carried)
        self.late_reported = self.trainer.account.unused["late"]
        self._catch_up()
        self.report(Joined(
            peer_id=self.peer_id, addresses=self.network.addresses, reachability=self.network.reachability,
            reachability_checked_at=self.network.checked_at, averaging_client=self.network.averaging_client,
            manifest=manifest.model_dump(mode="json"), manifest_hash=self.manifest_hash, device=self.device,
            precision=self.precision, quantization=self.quantization, micro_batch=self.micro_batch,
            grad_accum=self.grad_accum, parameters=self.loaded.parameters,
            trainable_parameters=self.loaded.trainable_parameters, nickname=spec.nickname,
            port_moves=self.port_moves, gradient_checkpointing=plan.gradient_checkpointing,
            calibrated_samples_per_second=self.calibration.samples_per_second, **self.trainer.account.totals(),
        ))
        self.network.watch()

    def _confirm_micro_batch(self):
        """Real forward/backward passes from the planned micro-batch, halved until they fit and grown while faster
        (``calibration``); the result is this worker's micro-batch, recorded in the plan cache and the events."""
        from p2ptrain.peers.worker.calibration import calibrate
        from p2ptrain.peers.worker.plan_cache import cache_key, record_measurement

        plan, manifest = self.plan, self.manifest
        calibration = calibrate(self.loaded.model, manifest.model, self.device, self.micro_batch, self.grad_accum, manifest.seq_len,
                                memory_cap_bytes=plan.memory_cap_bytes, max_micro_batch=plan.max_micro_batch)
        self.micro_batch, self.grad_accum = calibration.micro_batch, calibration.grad_accum
        key = cache_key(manifest.model, plan.device_name or self.device, self.precision, self.quantization)
        try:
            record_measurement(self.spec.paths.cache_dir, key, calibration.to_cache(manifest.seq_len))
        except OSError as error:
            logger.warning("Could not write the plan cache: %s", error)
        self.event("calibrated", calibration.words(), micro_batch=self.micro_batch, grad_accum=self.grad_accum,
                   samples_per_second=calibration.samples_per_second, out_of_memory_at=list(calibration.out_of_memory_at),
                   planned_micro_batch=calibration.planned, speeds={str(size): speed for size, speed in calibration.speeds.items()})
        return calibration

    def _catch_up(self) -> None:
        """Download the swarm's state if it is ahead of ours (checkpoint or fresh model), by its
        progress records or by what the trainer saw in its last round (``Trainer.is_behind``)."""
        if self.trainer.is_behind() or self.trainer.local_epoch < self.trainer.tracker.global_epoch:
            before = self.trainer.local_epoch
            self.trainer.load_state_from_peers()
            if self.trainer.local_epoch > before:
                self.state_downloaded(previous_epoch=before)

    def state_downloaded(self, **data) -> None:
        """The ``state-downloaded`` event: the new epoch, the peer that served the state (``source``),
        and the samples of local progress that were too many epochs behind to keep (the ``late`` ones
        since the last such event)."""
        epoch, late, source = self.trainer.local_epoch, self.trainer.account.unused["late"], self.trainer.state_source
        dropped, self.late_reported = late - self.late_reported, late
        kept = f"; {dropped} samples of local progress were too far behind to use" if dropped else ""
        served = f" from {source}" if source else ""
        self.event("state-downloaded", f"caught up with the swarm at epoch {epoch}{served}{kept}", epoch=epoch,
                   dropped_samples=dropped, source=source, **data)

    # --- checkpoints --------------------------------------------------
    def _checkpoint_file(self) -> Path:
        from p2ptrain.peers.model.checkpoint import checkpoint_path

        return checkpoint_path(self.spec.paths.checkpoints_dir, self.spec.run_id)

    def _read_checkpoint(self) -> dict | None:
        """This run's checkpoint, or None; one holding NaN or infinity is kept aside, never loaded."""
        from p2ptrain.peers.model.checkpoint import load_checkpoint, non_finite_problem, set_aside

        path = self._checkpoint_file()
        state = load_checkpoint(path, manifest_hash=self.manifest.manifest_hash())
        if state is None and path.exists():
            self.event("checkpoint-ignored", f"checkpoint {path} is unreadable or of another manifest; starting without it")
        problem = non_finite_problem(state) if state is not None else None
        if problem:
            kept = set_aside(path, "non-finite")
            self.event("checkpoint-ignored", f"checkpoint {path} not used: {problem} (saved while training diverged?); "
                       f"kept aside as {kept}", reason="non-finite", kept_as=str(kept))
            return None
        return state

    def save_checkpoint(self, why: str) -> None:
        """Write the checkpoint, only from a state that passed the divergence guard: while training
        diverges, or with a non-finite value anywhere, the last good checkpoint stays."""
        from p2ptrain.peers.model.checkpoint import non_finite_problem, save_checkpoint

        if self.trainer is None:
            return
        state = {
            "trainable": self.loaded.trainable_state(), "trainer": self.trainer.state_dict(),
            "epoch": self.trainer.local_epoch, "data_position": self.batches.position,
            "manifest_hash": self.manifest_hash, **self.trainer.account.as_dict(),
            "manifest": self.manifest.model_dump(mode="json"),  # what `p2ptrain export` rebuilds the model from
            "divergence": self.guard.state_dict(),
        }
        problem = "training is diverging" if not self.guard.healthy else non_finite_problem(state)
        if problem:
            self.event("checkpoint-skipped", f"checkpoint not saved ({why}): {problem}; the last good one stays",
                       reason=why, problem=problem, epoch=self.trainer.local_epoch)
            return
        try:
            save_checkpoint(self._checkpoint_file(), state)
            remember_peers(self.dht, peers_file(self._checkpoint_file()))
        except OSError as error:
            self.report(Error(f"could not write the checkpoint: {error}", "free disk space or fix permissions of the state directory"))
            return
        self.last_checkpoint = time.monotonic()
        self.event("checkpoint-saved", f"checkpoint saved ({why}) at epoch {self.trainer.local_epoch}", epoch=self.trainer.local_epoch, reason=why)

    # --- the loop -------------------------------------------------------
    def run(self) -> None:
        """Train until ``leave`` or a signal; commands run between micro-steps (``command_inbox``)."""
        self.interruptible = False
        self.last_checkpoint = time.monotonic()
        self.checkpoint_interval_s = self.spec.checkpoint_interval_s
        self.trainer.scale_lr(self.guard.lr_scale)
        if not self._checkpoint_file().exists():
            self.save_checkpoint("start")  # a good state to roll back to, should training diverge early
        self.set_state("paused" if self.spec.start_paused else "training")
        self.inbox = CommandInbox(self.conn, self._command_arrived, self._unknown_command, kept=self.kept_commands)
        self.inbox.start()
        threading.Thread(target=self._report_swarm_forever, name="swarm-reporter", daemon=True).start()
        self.new_window()
        # idle time (see new_window): since the last batch was trained, while training, and how long before that
        self.computed_at: float | None = None
        self.idle_before = 0.0
        self.epoch_started_at, self.epoch_losses = time.time(), []
        while not self.stop_requested and not self.left:
            self.handle_commands()
            if self.stop_requested or self.left:
                break
            if time.monotonic() - self.last_checkpoint > self.checkpoint_interval_s:
                self.save_checkpoint("timer")
            if self.state != "training":
                self.inbox.wait(0.2)
                continue
            if self.trainer.is_behind():
                self._catch_up()
            if not self.trainer.wants_batch():
                self.after_step(self.trainer.tick())
                time.sleep(0.05)
                continue
            rest = self.duty.rest_left_s()
            if rest > 0:
                self.inbox.wait(min(rest, 0.2))  # a command ends the wait early
                continue
            self.train_one_step()

    def set_state(self, state: str, reason: str | None = None) -> None:
        self.state = state
        self.computed_at = None  # a pause is not idle time
        self.report(StateChanged(state, reason))

    def handle_commands(self) -> None:
        """Run the daemon's commands that arrived (``command_inbox``), each by its handler in
        ``command_handlers`` (the command's fields are the handler's keyword arguments); stop once
        the daemon closed the pipe."""
        for command in self.inbox.take():
            self.command_handlers[type(command)](**command.to_dict())
            if self.left:
                return
        if self.inbox.closed:
            self.stop_requested = True

    def _command_arrived(self, command: Command) -> None:
        """On the inbox's reader thread, as a command arrives: for a pause or leave, let go of the averaging
        rounds that found no group, which a step may be waiting for (``command_inbox``); the loop runs the
        command once that step returns."""
        trainer = self.trainer
        if isinstance(command, (Pause, Leave)) and trainer is not None and not self.left:
            trainer.abandon_rounds(without_group=True)

    def _unknown_command(self, received: str) -> None:
        self.report(Error(f"unknown worker command {received:.200}", "send pause, resume, finish, leave or unban"))

    def on_pause(self) -> None:
        self.pause()

    def on_resume(self) -> None:
        self.finish_at_epoch = None
        if self.state != "training":  # started paused
            self._catch_up()
            self.set_state("training")

    def on_finish(self) -> None:
        self.finish_at_epoch = self.trainer.local_epoch + 1
        if self.state != "training":
            self.set_state("training")

    def on_use_plan(self, plan: WorkerPlan | None, failure: str, fix: str) -> None:
        """A plan that came after this worker stopped waiting for one (or never asked): it keeps its own."""
        logger.warning("Ignoring a hardware plan sent while training: the worker already has one")

    def on_unban(self, peers: list[str] | None) -> None:
        """Lift this peer's bans of ``peers`` (all when None): the daemon's ``unban``."""
        lifted = self.trainer.trust.unban(peers)
        logger.info("Lifted the bans of %s", ", ".join(lifted) or "nobody")

    def pause(self, finished: bool = False, reason: str | None = None) -> None:
        """Checkpoint, leave the swarm and end the worker: a paused peer holds no memory
        and takes no part in matchmaking. ``resume`` starts a new worker from this checkpoint.
        ``reason``: why the worker pauses on its own (``StateChanged.reason``)."""
        self.trainer.skip_batch()
        self.trainer.pause()
        self.save_checkpoint("pause")
        self.report_steps(last=True)  # what the daemon shows while paused: the checkpoint's totals
        self.leave_swarm()
        self.set_state("finished" if finished else "paused", reason)

    def leave(self) -> None:
        self.save_checkpoint("leave")
        self.leave_swarm()
        self.report(Left())

    def leave_swarm(self) -> None:
        """Say goodbye and shut the trainer and the DHT down; the loop ends and the process exits 0."""
        self.left = True
        self.goodbye()
        for closing in (self.network, self.trainer, self.dht):
            try:
                closing.shutdown()
            except Exception:
                logger.exception("Error while shutting down %s", type(closing).__name__)
        self.network = self.trainer = self.dht = None

    def train_one_step(self) -> None:
        """Accumulate ``grad_accum`` micro-batches and hand them to the trainer,
        unless a loss or gradient is not finite (then nothing is contributed)."""
        import torch

        from p2ptrain.peers.model.models import causal_lm_loss

        losses = []
        self.count_idle_time()
        started = time.monotonic()
        for _ in range(self.grad_accum):
            loss = causal_lm_loss(self.loaded.model, next(self.batches))
            if not torch.isfinite(loss):
                self.trainer.skip_batch()
                self.count_rejected((len(losses) + 1) * self.micro_batch)
                self.event("non-finite", "skipped a batch with a non-finite loss; nothing was contributed", loss=str(loss.item()))
                self.guard_step(None)
                return
            (loss / self.grad_accum).backward()
            losses.append(loss.item())
            if self.grad_accum > 1:
                self.handle_commands()
                if self.left:
                    return  # paused or left: the batch was skipped
                if self.stop_requested:
                    self.trainer.skip_batch()
                    return
        gradients = [p.grad for p in self.trainer.parameters if p.grad is not None]
        samples = self.micro_batch * self.grad_accum
        if not all(bool(torch.isfinite(g).all()) for g in gradients):
            self.trainer.skip_batch()
            self.count_rejected(samples)
            self.event("non-finite", "skipped a batch with non-finite gradients; nothing was contributed")
            self.guard_step(None)
            return
        outcome = self.trainer.step(samples)
        self.computed_at, self.idle_before = time.monotonic(), outcome.waited_s
        self.rest_s = self.duty.computed(self.computed_at - started - outcome.waited_s)
        self.last_loss = sum(losses) / len(losses)
        self.window["samples"] += samples
        self.window["losses"].append(self.last_loss)
        self.epoch_losses.append(self.last_loss)
        self.after_step(outcome)
        if not self.left:  # a finish that completed its epoch sent the last report
            self.report_steps()
            self.guard_step(self.last_loss)

    def guard_step(self, loss: float | None) -> None:
        """Show the divergence guard a step's loss (None: skipped as non-finite); roll back on divergence."""
        divergence = self.guard.observe(loss)
        if divergence is not None:
            self.roll_back(divergence)

    def roll_back(self, divergence: Divergence) -> None:
        """Training diverged: back to the last good checkpoint (then the swarm's state, when the swarm is
        ahead of it), at a lower learning rate of this peer's own; pause when it happened too often.
        What was trained since that checkpoint is not used (``rejected``)."""
        checkpoint = self._read_checkpoint()
        if checkpoint is not None:
            self.loaded.load_trainable_state(checkpoint["trainable"])
            self.trainer.load_state_dict(checkpoint["trainer"])
            self.trainer.account.add_unused("rejected", max(0, self.trainer.account.pending - self.trainer.pending_samples))
            self.guard.restored()
        lowered = self.trainer.scale_lr(divergence.lr_scale)
        restored = f"rolled back to the checkpoint of epoch {checkpoint['epoch']}" if checkpoint else "no good checkpoint to roll back to"
        lower = f", this peer's learning rate lowered to {divergence.lr_scale:.0%}" if lowered else ""
        pause = divergence.pause or checkpoint is None
        then = f"; paused after {divergence.rollbacks} rollbacks" if pause else ""
        self.event("diverged", f"training diverged: {divergence.describe()}; {restored}{lower}{then}",
                   reason=divergence.reason, steps=divergence.steps, level=divergence.level, loss=divergence.loss,
                   rollbacks=divergence.rollbacks, lr_scale=divergence.lr_scale if lowered else 1.0,
                   epoch=self.trainer.local_epoch, restored=checkpoint is not None, paused=pause)
        if pause:
            self.pause(reason="diverged")
        else:
            self._catch_up()

    def count_rejected(self, samples: int) -> None:
        """Samples trained on a batch that was skipped as non-finite: trained, never used."""
        self.trainer.account.add_trained(samples)
        self.trainer.account.add_unused("rejected", samples)

    def new_window(self) -> None:
        """Start the next step report's window: samples, losses, and idle time (seconds between
        training two batches, forward, backward and inner optimizer step, while training:
        averaging, downloads, waiting for the swarm, reports, epoch-end validation)."""
        self.window = {"started": time.monotonic(), "samples": 0, "losses": [], "idle_s": 0.0, "longest_idle_s": 0.0}

    def count_idle_time(self) -> None:
        if self.computed_at is not None:
            idle = self.idle_before + max(0.0, time.monotonic() - self.computed_at - self.rest_s)
            self.window["idle_s"] += idle
            self.window["longest_idle_s"] = max(self.window["longest_idle_s"], idle)

    def report_steps(self, last: bool = False) -> None:
        """Report the steps since the last report, at most every ``STEP_REPORT_INTERVAL_S``; ``last``: now."""
        elapsed = time.monotonic() - self.window["started"]
        if (elapsed < STEP_REPORT_INTERVAL_S and not last) or not self.window["losses"]:
            return
        if elapsed >= STEP_REPORT_INTERVAL_S:  # a last window shorter than that measures no rate
            self.samples_per_second = self.window["samples"] / elapsed
        self.report(Step(
            ts=time.time(), epoch=self.trainer.local_epoch,
            loss=sum(self.window["losses"]) / len(self.window["losses"]),
            samples=self.window["samples"], samples_per_second=self.samples_per_second,
            idle_s=self.window["idle_s"], longest_idle_s=self.window["longest_idle_s"], **self.trainer.account.totals(),
            waiting=self.trainer.waiting,
        ))
        self.new_window()

    def after_step(self, outcome) -> None:
        """Report what the trainer's step changed: averaging rounds, epoch ends, downloads,
        and the peers its averagers named (``trust``)."""
        for trust_event in self.trainer.trust.collect(self.trainer.local_epoch):
            self.event(trust_event.kind, trust_event.message, **trust_event.data)
        if outcome.averaged_with is not None:
            self.last_group = self.last_round_group = outcome.averaged_with
            if outcome.averaged_share < 1.0:
                self.event("averaging-incomplete", f"averaged with {outcome.averaged_with} peers, but only "
                           f"{outcome.averaged_share:.0%} of the values: a peer dropped out mid-round or returned a part "
                           "this peer refused, the rest kept this peer's own values", peers=outcome.averaged_with, share=outcome.averaged_share,
                           epoch=self.trainer.local_epoch)
            else:
                self.event("averaged", f"averaged with {outcome.averaged_with} peers", peers=outcome.averaged_with, epoch=self.trainer.local_epoch)
        if outcome.non_finite_average is not None:
            self.event("non-finite-average", outcome.non_finite_message(), peers=outcome.non_finite_average, epoch=self.trainer.local_epoch)
        if outcome.failed_rounds:
            self.event("averaging-failed", "an averaging round formed no group in time; trained on without it",
                       rounds=outcome.failed_rounds, epoch=self.trainer.local_epoch, reason="no-group")
        if outcome.failed_exchanges:
            self.event("averaging-failed", "an averaging group formed but its data exchange failed; trained on without it",
                       rounds=outcome.failed_exchanges, epoch=self.trainer.local_epoch, reason="exchange")
        if outcome.loaded_state:
            self.state_downloaded()
        if outcome.epoch_advanced:
            self.end_epoch(self.trainer.local_epoch - 1)

    def end_epoch(self, epoch: int) -> None:
        now = time.time()
        progress = self.trainer.tracker.global_progress
        self.report(Epoch(
            epoch=epoch, started_at=self.epoch_started_at, ended_at=now, duration_s=now - self.epoch_started_at,
            num_peers=max(progress.num_peers, 1), global_samples=self.manifest.target_batch_size,
            loss=sum(self.epoch_losses) / len(self.epoch_losses) if self.epoch_losses else None,
            val_loss=self.validation_loss(), averaged_with=getattr(self, "last_group", 1), **self.trainer.account.totals(),
        ))
        self.epoch_started_at, self.epoch_losses, self.last_group = now, [], 1
        if self.finish_at_epoch is not None and self.trainer.local_epoch >= self.finish_at_epoch:
            self.finish_at_epoch = None
            self.pause(finished=True)

    def validation_loss(self) -> float:
        from p2ptrain.peers.model.models import mean_loss

        return mean_loss(self.loaded.model, self.validation)

    def local_metrics(self, samples_per_second: float):
        """This peer's signed-record content (``LocalMetrics``), at ``samples_per_second``."""
        from hivemind.utils import get_dht_time

        from p2ptrain import __version__
        from p2ptrain.peers.swarm.records import MAX_BANS, LocalMetrics

        return LocalMetrics(
            peer_id=self.peer_id, nickname=self.spec.nickname[:64],
            device=self.spec.device_label or self.device, precision=self.precision, quantization=self.quantization, micro_batch=self.micro_batch,
            samples_per_second=samples_per_second, loss=self.last_loss, epoch=self.trainer.local_epoch,
            contributed_samples=self.trainer.account.contributed, trained_samples=self.trainer.account.trained,
            manifest_hash=self.manifest_hash,
            version=__version__, reachability=self.network.reachability, time=get_dht_time(),
            last_group=self.last_round_group, bans=sorted(self.trainer.trust.banned)[:MAX_BANS],
        )

    def _report_swarm_forever(self) -> None:
        from p2ptrain.peers.swarm.run_records import publish_metrics, withdraw_metrics
        from p2ptrain.peers.swarm.view import read_swarm

        published_state, published_at = None, -METRICS_INTERVAL_S
        while not self.left and not self.stop_requested:
            if self.trainer is None:
                return
            try:
                training, place = self.state == "training", self.trainer.tracker.place()
                if place != self.metrics_place:  # the swarm moved to another layout of shards: the old record goes
                    withdraw_metrics(self.dht, self.manifest.run_id, place=self.metrics_place)
                if time.monotonic() - published_at >= METRICS_INTERVAL_S or self.state != published_state \
                        or place != self.metrics_place:
                    publish_metrics(self.dht, self.manifest.run_id, self.local_metrics(self.samples_per_second if training else 0.0),
                                    self.manifest.format, place=place)
                    published_state, published_at, self.metrics_place = self.state, time.monotonic(), place
                self.report(read_swarm(self.dht, self.manifest.run_id, self.manifest_hash, self.manifest.target_batch_size,
                                       place=place))
            except Exception:
                logger.exception("Could not publish metrics or read the swarm")
            time.sleep(SWARM_REPORT_INTERVAL_S)

    def goodbye(self) -> None:
        """Clear this peer's metrics record, so peers drop it from their tables at once (a record that
        expires sooner than the last one cannot replace it: ``run_records.withdraw_metrics``)."""
        from p2ptrain.peers.swarm.run_records import withdraw_metrics

        try:
            withdraw_metrics(self.dht, self.manifest.run_id, place=self.metrics_place)
        except Exception:
            logger.exception("Could not say goodbye to the swarm")

    def close(self) -> None:
        """Checkpoint (unless already done by leave) and shut hivemind down."""
        self.interruptible = False
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if self.trainer is not None and not self.left:
            try:
                self.save_checkpoint("stop")
            except Exception:
                logger.exception("Could not checkpoint while stopping")
        if self.daemon_gone():
            return  # no one to say goodbye to in order: main() ends the whole group now
        goodbye = threading.Thread(target=self._say_goodbye, name="goodbye", daemon=True)
        goodbye.start()
        goodbye.join(GOODBYE_TIMEOUT_S)
        if goodbye.is_alive():
            logger.warning("hivemind's shutdown took over %.0f s (a round nobody came to?): ending its processes", GOODBYE_TIMEOUT_S)

    def _say_goodbye(self) -> None:
        """Shut the network watch, the trainer (hivemind's goodbye to the swarm) and the DHT down, in order."""
        for closing in (self.network, self.trainer, self.dht):
            if closing is None:
                continue
            try:
                closing.shutdown()
            except Exception:
                logger.exception("Error while shutting down %s", type(closing).__name__)
