"""``p2ptrain demo``: a local swarm on 127.0.0.1 training the built-in model on the built-in corpus.

Starts N daemons under temporary homes, has the first create a run and the
others join it with its address, then shows live progress (the TUI on a
terminal, text lines otherwise) until Ctrl-C or ``--duration``, and stops
everything it started. It is a client of the daemons like any other: it
never imports torch or hivemind itself.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from p2ptrain.control_types import MalformedReply, Status
from p2ptrain.paths import resolve_paths
from p2ptrain.protocol import ControlClient, DaemonError, DaemonNotRunning

RUN_NAME = "demo"
# how long the daemons get to checkpoint and leave when the demo stops, before they are killed
STOP_TIMEOUT_S = 60


def loopback_config(nickname: str | None = None, cpu_threads: int | None = 1, flush_interval_s: float = 1.0) -> str:
    """The config.toml of a daemon in a swarm on this one machine (the demo's, the tests' and benchmarks').

    Args:
        nickname: shown to the other peers (None: the daemon's default).
        cpu_threads: ``policy.max_cpu_threads`` (several daemons share the cores; None: no cap).
        flush_interval_s: how often the database is flushed.
    """
    lines = [f'nickname = "{nickname}"'] if nickname else []
    lines += ["[dht]", 'host_maddrs = ["/ip4/127.0.0.1/tcp/0"]', "use_relay = false", "use_auto_relay = false",
              "[storage]", f"flush_interval_s = {flush_interval_s}"]
    if cpu_threads is not None:
        lines += ["[policy]", f"max_cpu_threads = {cpu_threads}"]
    return "\n".join(lines) + "\n"


# Small enough that an epoch takes seconds on a laptop CPU, so the demo shows averaging quickly.
DEMO_MANIFEST = {"target_batch_size": 256, "local_steps": 20, "micro_batch_hint": 8}


class DemoPeer:
    """One daemon of the demo, under its own home."""

    def __init__(self, home: Path, nickname: str, threads: int):
        self.home = home
        self.nickname = nickname
        home.mkdir(parents=True, exist_ok=True)
        (home / "config.toml").write_text(loopback_config(nickname, threads))
        self.log_path = home / "daemon.log"
        self.process: subprocess.Popen | None = None
        self.client = ControlClient(str(resolve_paths(home).socket), timeout=10)

    def start(self) -> None:
        with open(self.log_path, "ab") as log_file:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "p2ptrain.cli", "daemon", "--home", str(self.home)],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def wait_for(self, predicate, timeout_s: float, what: str) -> Status:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"{self.nickname}'s daemon exited ({self.process.returncode}); see {self.log_path}")
            try:
                status = Status.from_dict(self.client.call("status"), f"{self.nickname}'s status")
                if predicate(status):
                    return status
            except (DaemonNotRunning, OSError):
                pass
            time.sleep(0.3)
        raise RuntimeError(f"{self.nickname}: timed out waiting for {what}; see {self.log_path}")

    def ask_to_stop(self) -> None:
        """SIGTERM the daemon, if it runs: it checkpoints, leaves the run and exits."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def wait_or_kill(self, deadline: float) -> None:
        """Wait until ``deadline`` (``time.monotonic()``) for the daemon to exit, then SIGKILL its session."""
        if self.process is None:
            return
        try:
            self.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(5)


def stop_all(peers: list[DemoPeer]) -> None:
    """Stop every peer's daemon at once (one by one, each would wait out rounds with the others)."""
    for peer in peers:
        peer.ask_to_stop()
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for peer in peers:
        peer.wait_or_kill(deadline)


def _progress_line(peers: list[DemoPeer]) -> str:
    parts = []
    for peer in peers:
        try:
            status = Status.from_dict(peer.client.call("status"), f"{peer.nickname}'s status")
        except (DaemonNotRunning, DaemonError, OSError, MalformedReply):
            parts.append(f"{peer.nickname}: down")
            continue
        run, local = status.run, status.local
        loss = local.loss if local else None
        speed = local.samples_per_second if local else None
        parts.append(
            f"{peer.nickname}: {status.state} epoch {run.epoch if run else 0}"
            + (f" loss {loss:.3f}" if loss is not None else "")
            + (f" {speed:.0f} samples/s" if speed else "")
        )
    return " | ".join(parts)


def _show_text(peers: list[DemoPeer], duration_s: float | None) -> None:
    deadline = time.monotonic() + duration_s if duration_s else None
    while deadline is None or time.monotonic() < deadline:
        print(time.strftime("%H:%M:%S"), _progress_line(peers), flush=True)
        time.sleep(5)


def _show_tui(first: DemoPeer) -> None:
    from p2ptrain.tui.app import main as tui_main

    tui_main(["--home", str(first.home)])


def run_demo(peers: int = 3, mode: str = "sync", base_dir: str | None = None, duration_s: float | None = None, ui: str = "auto") -> int:
    """Run the demo swarm; returns an exit code.

    Args:
        peers: how many daemons to start (at least 1).
        mode: ``sync`` or ``diloco``.
        base_dir: keep the peers' homes here; None uses a temporary directory removed at the end.
        duration_s: stop after this many seconds; None runs until Ctrl-C (or until the TUI is closed).
        ui: ``tui`` (the dashboard of the first peer), ``text`` (a progress line every 5 s), or
            ``auto`` (the TUI on a terminal without --duration, text otherwise).
    """
    if peers < 1:
        print("p2ptrain demo: --peers must be at least 1", file=sys.stderr)
        return 2
    root = Path(base_dir) if base_dir else Path(tempfile.mkdtemp(prefix="p2ptrain-demo-"))
    # The peers share this machine: split its cores between them rather than oversubscribe them.
    threads = max(1, (os.cpu_count() or 1) // peers)
    swarm = [DemoPeer(root / f"peer{index}", f"peer{index}", threads) for index in range(peers)]
    use_tui = ui == "tui" or (ui == "auto" and sys.stdout.isatty() and duration_s is None)
    try:
        print(f"starting {peers} daemons under {root} ...", flush=True)
        for peer in swarm:
            peer.start()
        first = swarm[0]
        first.wait_for(lambda status: True, 60, "the daemon to start")
        first.client.call("join", run=RUN_NAME, new_run=True, manifest={"mode": mode, **DEMO_MANIFEST})
        status = first.wait_for(lambda status: status.local and status.local.addresses, 300, "the run to be created")
        address = status.local.addresses[0]
        print(f"run {RUN_NAME!r} ({mode}) created by peer0 at {address}", flush=True)
        for peer in swarm[1:]:
            peer.wait_for(lambda status: True, 60, "the daemon to start")
            peer.client.call("join", run=RUN_NAME, initial_peers=[address])
        print("the others are joining; Ctrl-C stops the demo", flush=True)
        if use_tui:
            _show_tui(first)
        else:
            _show_text(swarm, duration_s)
    except KeyboardInterrupt:
        pass
    except (RuntimeError, DaemonError) as error:
        message = error.one_line() if isinstance(error, DaemonError) else str(error)
        print(f"p2ptrain demo: {message}", file=sys.stderr)
        return 1
    finally:
        # Stop the daemons even when nobody reads the output any more (`p2ptrain demo | head -2`).
        with contextlib.suppress(BrokenPipeError):
            print("stopping the demo's daemons ...", flush=True)
        stop_all(swarm)
        if not base_dir:
            shutil.rmtree(root, ignore_errors=True)
    return 0
