"""Real ``p2ptrain daemon`` processes for tests, and the CLI run as a user would.

Each daemon runs in its own session (process group), so a test can end it
and everything it started, even after SIGKILLing the daemon itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from p2ptrain.control_types import Status
from p2ptrain.daemon.worker_process import recorded_group
from p2ptrain.demo import loopback_config
from p2ptrain.paths import resolve_paths
from p2ptrain.processes import dying_with_parent
from p2ptrain.protocol import ControlClient, DaemonNotRunning

import shutil

# The installed console script, as a user runs it; the module when not installed.
_SCRIPT = shutil.which("p2ptrain", path=os.path.dirname(sys.executable))
P2PTRAIN = [_SCRIPT] if _SCRIPT else [sys.executable, "-m", "p2ptrain.cli"]


def child_environment(extra: dict | None = None) -> dict:
    environment = dict(os.environ)
    environment.pop("NOTIFY_SOCKET", None)
    environment.pop("P2PTRAIN_HOME", None)
    # importing torch's inductor (transformers, peft) in this test process sets it to /tmp/torchinductor_<user>;
    # a user's daemon would not inherit it
    environment.pop("TORCHINDUCTOR_CACHE_DIR", None)
    environment.update({"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
    environment.update(extra or {})
    return environment


def write_local_config(home: Path) -> None:
    """A config for tests (:func:`local_config`) in ``home``, the peer named after the directory."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(local_config(home.name))


def local_config(nickname: str) -> str:
    """The text of a config for tests: listen on 127.0.0.1 only, flush the database often, one torch thread
    (several daemons share this machine's 2 cores)."""
    return loopback_config(nickname[:32], cpu_threads=1, flush_interval_s=0.5)


def cli(home: Path, *args: str, timeout: float = 120, env: dict | None = None, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """Run ``p2ptrain ARGS --home HOME`` and return the finished process (text output).

    ``prefix`` runs it under another command, e.g. ``ip netns exec NS`` in the network lab."""
    return subprocess.run(
        [*prefix, *P2PTRAIN, *args, "--home", str(home)], capture_output=True, text=True, timeout=timeout, env=child_environment(env)
    )


@dataclass
class DaemonProcess:
    """A running ``p2ptrain daemon --home HOME``."""

    home: Path
    process: subprocess.Popen
    log_path: Path
    pgids: set[int] = field(default_factory=set)

    @property
    def client(self) -> ControlClient:
        return ControlClient(str(resolve_paths(self.home).socket), timeout=10)

    def status(self) -> dict:
        """The ``status`` result as the wire has it, checked against its record (``control_types.Status``)."""
        reply = self.client.call("status")
        Status.from_dict(reply, "the daemon's status reply")
        return reply

    def wait_until(self, predicate, timeout: float, interval: float = 0.5, what: str = "condition") -> dict:
        """Poll ``status`` until ``predicate(status)`` holds; returns that status."""
        deadline = time.monotonic() + timeout
        status = {}
        while time.monotonic() < deadline:
            try:
                status = self.status()
            except (DaemonNotRunning, OSError):
                status = {}
            if status and predicate(status):
                return status
            if self.process.poll() is not None:
                raise AssertionError(f"daemon exited with {self.process.returncode} while waiting for {what}; log:\n{self.log()}")
            time.sleep(interval)
        raise AssertionError(f"timed out after {timeout} s waiting for {what}; last status: {json.dumps(status)[:2000]}\nlog tail:\n{self.log()[-4000:]}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def terminate(self, timeout: float = 30) -> int:
        """SIGTERM the daemon and wait for it; returns its exit code."""
        self.ask_to_stop()
        return self.wait_or_kill(timeout)

    def ask_to_stop(self) -> None:
        """SIGTERM the daemon, if it runs (it checkpoints, leaves its run and exits)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def wait_or_kill(self, timeout: float) -> int:
        """Wait up to ``timeout`` for the daemon to exit, then SIGKILL its whole session; returns its exit code."""
        try:
            self.process.wait(max(0.0, timeout))
        except subprocess.TimeoutExpired:
            self.kill()
        return self.process.returncode

    @property
    def state_dir(self) -> Path:
        return resolve_paths(self.home).state_dir

    def kill(self) -> None:
        """SIGKILL the daemon's whole session: the daemon, its workers and everything they started."""
        pgids = {self.process.pid} | self.pgids
        for pgid_file in self.state_dir.glob("worker*.pgid"):
            try:
                pgids.add(recorded_group(pgid_file)[0])
            except (OSError, ValueError):
                pass
        for pgid in pgids:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            pass


def stop_all(daemons, timeout: float = 30) -> None:
    """End several daemons at once (a test's cleanup): SIGTERM to all, then wait for each until one
    shared ``timeout``, then SIGKILL each one's whole session (leftovers of a daemon that exited too)."""
    daemons = list(daemons)
    for daemon in daemons:
        daemon.ask_to_stop()
    deadline = time.monotonic() + timeout
    for daemon in daemons:
        daemon.wait_or_kill(deadline - time.monotonic())
        daemon.kill()


def start_daemon(home: Path, env: dict | None = None, wait: bool = True, log_level: str = "info", prefix: tuple[str, ...] = ()) -> DaemonProcess:
    """Start ``p2ptrain daemon --home HOME`` in its own session; wait until it answers ``status``.
    It is sent SIGTERM when the thread that started it ends, so a test process that is killed
    (SIGKILL, a whole run stopped) leaves no daemon behind; start it from the test's own thread.

    ``prefix`` runs it under another command, e.g. ``ip netns exec NS`` in the network lab."""
    home.mkdir(parents=True, exist_ok=True)
    log_path = home / f"daemon-{time.time_ns()}.log"
    with open(log_path, "w") as log_file:
        process = subprocess.Popen(
            [*prefix, *P2PTRAIN, "daemon", "--home", str(home), "--log-level", log_level],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=child_environment(env),
            start_new_session=True,
            preexec_fn=dying_with_parent(),
        )
    daemon = DaemonProcess(home, process, log_path)
    if wait:
        daemon.wait_until(lambda status: True, timeout=30, interval=0.1, what="the daemon to answer")
    return daemon


@contextlib.contextmanager
def local_swarm(root: Path, run: str, run_options: list[str], names: tuple[str, ...] = ("a", "b", "c"),
                configure=write_local_config):
    """Daemons on 127.0.0.1 in one run, for a module's swarm fixture: one per name (``root / name``, its config
    written by ``configure(home)``), the first creates ``run`` with ``run_options`` (``join --new-run`` options),
    the others join it through the first one's address. Yields ``(daemons, address)``; all are stopped after."""
    daemons = []
    try:
        for name in names:
            configure(root / name)
            daemons.append(start_daemon(root / name))
        created = cli(daemons[0].home, "join", "--new-run", run, *run_options)
        assert created.returncode == 0, created.stderr
        status = daemons[0].wait_until(lambda s: (s.get("local") or {}).get("addresses"), 180, what=f"{names[0]} to publish its run")
        address = status["local"]["addresses"][0]
        for daemon in daemons[1:]:
            joined = cli(daemon.home, "join", run, "--peers", address)
            assert joined.returncode == 0, joined.stderr
        yield daemons, address
    finally:
        stop_all(daemons)


def raw_exchange(socket_path, payload: bytes, timeout: float = 10) -> list[dict]:
    """Send raw bytes on a control socket, hang up the sending side, and return every JSON line answered."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(socket_path))
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return [json.loads(line) for line in data.splitlines() if line.strip()]


def still_running(processes: list[psutil.Process], timeout: float) -> list[str]:
    """Wait up to ``timeout`` for ``processes`` to end; describe the ones that did not."""
    _, alive = psutil.wait_procs(processes, timeout=timeout)
    left = []
    for process in alive:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{process.pid} {' '.join(process.cmdline())[:120]}")
        except psutil.NoSuchProcess:
            pass
    return left


def processes_marked(mark: str) -> list[psutil.Process]:
    """Processes whose environment has ``P2PTRAIN_TEST_MARK=mark`` (inherited by everything a
    command starts, p2pd included), so a test can find what it started and check it all ended."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get("P2PTRAIN_TEST_MARK") == mark:
                found.append(process)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            pass
    return found


def wait_for(read, condition, timeout: float, what: str, interval: float = 1.0):
    """Call ``read()`` until ``condition(value)`` holds and return that value; fail after ``timeout`` seconds
    with the last value read."""
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if condition(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}; last: {str(value)[:3000]}")
        time.sleep(interval)
