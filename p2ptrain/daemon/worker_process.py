"""Starting, talking to and stopping one training worker process.

The worker runs ``p2ptrain.peers.worker.training_worker.main`` in a ``spawn`` process, so the
supervisor never imports torch or hivemind. The worker makes itself a
process-group leader (its DHT process, averagers and p2pd stay in that group)
and asks the kernel for SIGTERM when the daemon dies. The group id is written
to the worker's pgid file (one per worker: ``worker.pgid``,
``worker-gpu1.pgid``...), its first line, so that a daemon started after a
SIGKILL can end whatever the previous one left behind
(``reap_leftover_groups``). The pids of the group's processes follow, one a
line, as the daemon finds them: their shared memory is removed once the group
has ended (``temp_files.remove_shared_memory``).

``P2PTRAIN_WORKER_MEMORY_HEADROOM_MB`` (environment of the daemon) caps the
worker's address space, once it has joined, at its size then plus that many
MiB (RLIMIT_AS, soft limit, set from outside with prlimit; the DHT, averager
and p2pd processes it started before are not capped). Allocations beyond the
cap fail for real, so this is how the fault tests make a CPU worker run out of
memory; a volunteer may also use it to bound what training takes.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import pickle
import resource
import signal
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

import psutil

from p2ptrain.daemon.temp_files import remove_shared_memory, remove_worker_temp_dir
from p2ptrain.daemon.worker_slots import leftover_pgid_files
from p2ptrain.processes import group_alive, group_members, kill_group, name_this_process
from p2ptrain.worker_pipe import Command, Joined, MalformedMessage, Report, WorkerSpec, decode_report, encode

MEMORY_HEADROOM_ENV = "P2PTRAIN_WORKER_MEMORY_HEADROOM_MB"
EXIT_POLL_S = 1.0
MEMBERS_POLL_S = 10.0  # how often the daemon looks for a worker's new processes (they start at its join)
log = logging.getLogger(__name__)


def _run_worker(conn, spec: dict) -> None:
    """The spawn target: only here, in the child, do torch and hivemind get imported.

    The spec's ``environment`` (``CUDA_VISIBLE_DEVICES`` of a GPU worker) is
    set first, so CUDA sees only the worker's own GPU, and so is its own
    ``TMPDIR`` (``temp_dir``), so its leftovers go with it.
    """
    name_this_process()  # another daemon on this GPU sees a p2ptrain worker, not "another program"
    os.environ.update(spec["environment"])
    if spec.get("temp_dir"):
        os.environ["TMPDIR"] = tempfile.tempdir = spec["temp_dir"]
    from p2ptrain.peers.worker.training_worker import main

    main(conn, spec)


def received_reports(conn, name: str) -> Iterator[Report]:
    """The reports waiting on the daemon's end of a worker's pipe; a malformed one is logged and skipped.

    Args:
        conn: the pipe.
        name: the worker's name, for the log.

    Raises:
        EOFError, OSError: the worker's end is closed.
    """
    while conn.poll():
        try:
            yield decode_report(conn.recv())
        except (MalformedMessage, pickle.UnpicklingError, AttributeError, ImportError) as error:
            log.warning("ignoring a report of worker %s: %s", name, error)


def recorded_group(pgid_file: Path) -> tuple[int, list[int]]:
    """The process group a worker's pgid file records, and the pids of its processes found so far.

    Raises:
        OSError: no such file.
        ValueError: it holds no group.
    """
    pgid, *members = (int(line) for line in pgid_file.read_text().split())
    return pgid, members


def reap_leftover_group(pgid_file: Path) -> int | None:
    """End the worker group a previous daemon recorded (it was SIGKILLed), and remove its processes' shared
    memory; returns the pgid it ended."""
    try:
        pgid, members = recorded_group(pgid_file)
    except (FileNotFoundError, ValueError):
        return None
    alive = group_alive(pgid)
    if alive:
        log.warning("ending worker process group %d left behind by a previous daemon", pgid)
        kill_group(pgid, grace_s=5.0)
    # a pid alive now is another program's (the pid was reused since): its files are not ours
    remove_shared_memory(pid for pid in {pgid, *members} if not psutil.pid_exists(pid))
    pgid_file.unlink(missing_ok=True)
    return pgid if alive else None


def reap_leftover_groups(state_dir: Path) -> list[int]:
    """End the groups of all workers a previous daemon recorded in ``state_dir``; returns the pgids it ended."""
    ended = (reap_leftover_group(pgid_file) for pgid_file in leftover_pgid_files(state_dir))
    return [pgid for pgid in ended if pgid is not None]


class WorkerProcess:
    """One running training worker.

    Args:
        spec: what the worker runs.
        pgid_file: where to record the worker's process group.
        on_report: called in the event loop with each report the worker sends
            (a malformed one is logged and dropped).
        on_exit: called in the event loop once the process has ended, with its exit code.
        name: the worker's name in logs and its process title (``gpu1``, ``cpu``).
    """

    def __init__(self, spec: WorkerSpec, pgid_file: Path, on_report: Callable[[Report], None], on_exit: Callable[[int | None], None], name: str = ""):
        self.spec = spec
        self.name = name
        self.pgid_file = pgid_file
        self.on_report = on_report
        self.on_exit = on_exit
        self.started_at = time.time()
        self._process = None
        self._conn = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._exited = False
        self._members: set[int] = set()  # the pids of the worker's processes found so far, itself included
        self._members_noted_at = 0.0

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def start(self) -> None:
        if self.spec.temp_dir:
            os.makedirs(self.spec.temp_dir, mode=0o700, exist_ok=True)
        context = multiprocessing.get_context("spawn")
        self._conn, child_conn = context.Pipe()
        self._process = context.Process(target=_run_worker, args=(child_conn, self.spec.to_dict()), name=f"p2ptrain-worker-{self.name}" if self.name else "p2ptrain-worker")
        self._process.start()
        child_conn.close()
        self.pgid_file.write_text(f"{self._process.pid}\n")
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._conn.fileno(), self._read_reports)
        self._loop.add_reader(self._process.sentinel, self._process_ended)
        self._loop.call_later(EXIT_POLL_S, self._poll_exit)
        log.info("training worker %s started (pid %d)", self.name, self._process.pid)

    def send(self, command: Command) -> bool:
        """Send a command; False if the worker is gone."""
        if self._exited or self._conn is None:
            return False
        try:
            self._conn.send(encode(command))
            return True
        except (BrokenPipeError, OSError):
            return False

    def _read_reports(self) -> None:
        try:
            for report in received_reports(self._conn, self.name):
                if isinstance(report, Joined):
                    self._cap_address_space()
                    self._note_members()  # its DHT and averager processes have started
                self.on_report(report)
        except (EOFError, OSError):
            self._loop.remove_reader(self._conn.fileno())

    def _cap_address_space(self) -> None:
        """Apply ``P2PTRAIN_WORKER_MEMORY_HEADROOM_MB`` (see the module docstring)."""
        headroom_mb = os.environ.get(MEMORY_HEADROOM_ENV)
        if not headroom_mb:
            return
        try:
            limit = psutil.Process(self._process.pid).memory_info().vms + int(headroom_mb) * 2**20
            resource.prlimit(self._process.pid, resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))
        except (ValueError, OSError, psutil.Error) as error:
            log.warning("could not cap the worker's memory (%s=%r): %s", MEMORY_HEADROOM_ENV, headroom_mb, error)
            return
        log.info("worker address space capped at %d MiB (%s)", limit >> 20, MEMORY_HEADROOM_ENV)

    def _poll_exit(self) -> None:
        """Notice a worker that died without its children (SIGKILL, OOM killer).

        The sentinel is a pipe whose write end the worker's forked children
        (DHT, averagers) inherited: it reads EOF only once they are gone too.
        waitpid sees the worker's own exit at once.
        """
        if self._exited:
            return
        if self._process.is_alive():
            if time.monotonic() - self._members_noted_at >= MEMBERS_POLL_S:
                self._note_members()
            self._loop.call_later(EXIT_POLL_S, self._poll_exit)
        else:
            self._process_ended()

    def _note_members(self, found: set[int] | None = None) -> None:
        """Remember the worker's processes, here and in its pgid file.

        Args:
            found: their pids; None: the worker and its descendants now.
        """
        self._members_noted_at = time.monotonic()
        if found is None:
            try:
                found = {self._process.pid} | {child.pid for child in psutil.Process(self._process.pid).children(recursive=True)}
            except psutil.Error:
                return
        new = found - self._members
        if new:
            self._members |= new
            with self.pgid_file.open("a") as file:
                file.write("".join(f"{pid}\n" for pid in sorted(new)))

    def _process_ended(self) -> None:
        if self._exited:
            return
        self._loop.remove_reader(self._process.sentinel)
        # Whatever the worker started (DHT, averagers, p2pd) goes with it, first:
        # its forked children hold the pipe's write end, so after a SIGKILL in
        # the middle of a report, reading would wait for the rest of it forever.
        self._note_members({member.pid for member in group_members(self._process.pid)})  # an orphan is in the group still
        kill_group(self._process.pid)
        remove_worker_temp_dir(self.spec.temp_dir)
        remove_shared_memory(self._members | {self._process.pid})
        self._read_reports_if_open()
        self._process.join(0)
        exitcode = self._process.exitcode
        self._exited = True
        self.pgid_file.unlink(missing_ok=True)
        log.info("training worker %s exited with code %s", self.name, exitcode)
        self.on_exit(exitcode)

    def _read_reports_if_open(self) -> None:
        if self._conn is not None and not self._conn.closed:
            try:
                self._read_reports()
            finally:
                try:
                    self._loop.remove_reader(self._conn.fileno())
                except (ValueError, OSError):
                    pass
                self._conn.close()

    def terminate(self) -> bool:
        """Ask the worker to checkpoint (if it has joined) and exit: SIGTERM, without waiting. False if it is gone.

        It honours it within ``STOP_DEADLINE_S`` (then it ends its group itself)."""
        if self._exited or self._process is None:
            return False
        try:
            os.kill(self._process.pid, signal.SIGTERM)
        except ProcessLookupError:
            return False
        return True

    async def stop(self, timeout_s: float) -> None:
        """Ask the worker to checkpoint and exit (SIGTERM), then kill its group after ``timeout_s``."""
        if not self.terminate():
            return
        deadline = time.monotonic() + timeout_s
        while not self._exited and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        if not self._exited:
            log.warning("training worker did not stop within %.0f s; killing it", timeout_s)
            kill_group(self._process.pid)
            self._process.join(1)
            if not self._exited:
                self._process_ended()

    async def wait(self, timeout_s: float) -> bool:
        """Wait for the worker to exit by itself (after ``leave``); True if it did."""
        deadline = time.monotonic() + timeout_s
        while not self._exited and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        return self._exited
