"""Soak with churn: real daemons on 127.0.0.1, one leaving and one joining every interval.

Peer 0 creates a `sync` run of the `tiny` model (target batch 192, micro-batch 8)
and stays; the others join through it. Every ``--churn-every`` seconds the
oldest of the others leaves (``p2ptrain leave``, then its daemon stops) and a
new daemon joins. Measured:

- epochs the run advanced (peer 0's view) and epochs per minute;
- the share of finished local epochs whose averaging round succeeded with at
  least one other peer (``averaged`` events with peers >= 2 / ``epochs`` rows,
  over every peer's database);
- resident memory growth per peer: the sum over the worker's processes (the
  worker, its DHT and averager processes, p2pd), from the first sample while
  training to the last, in MiB per minute (hivemind's averager is known to
  leak when averaging keeps failing).

Prints a markdown table (for benchmarks/RESULTS.md); ``--json`` prints the raw numbers.

    .venv/bin/python benchmarks/soak.py [--peers 6] [--minutes 5] [--churn-every 60] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from p2ptrain.paths import resolve_paths
from p2ptrain.protocol import ControlClient, DaemonNotRunning

CONFIG = """\
nickname = "{name}"
[dht]
host_maddrs = ["/ip4/127.0.0.1/tcp/0"]
use_relay = false
use_auto_relay = false
[storage]
flush_interval_s = 1.0
"""
RUN = ["--mode", "sync", "--target-batch-size", "192", "--micro-batch", "8"]
SAMPLE_EVERY_S = 10.0
P2PTRAIN = [sys.executable, "-m", "p2ptrain.cli"]


def environment() -> dict:
    env = {key: value for key, value in os.environ.items() if key not in ("NOTIFY_SOCKET", "P2PTRAIN_HOME")}
    env["HF_HUB_OFFLINE"] = "1"
    return env


def cli(home: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*P2PTRAIN, *args, "--home", str(home)], capture_output=True, text=True, timeout=timeout, env=environment())


@dataclass
class Peer:
    """One daemon and the resident-memory samples of its worker."""

    name: str
    home: Path
    process: subprocess.Popen
    rss_samples: list[tuple[float, int]] = field(default_factory=list)

    def status(self) -> dict:
        try:
            return ControlClient(str(resolve_paths(self.home).socket), timeout=10).call("status")
        except (DaemonNotRunning, OSError):
            return {}

    def worker_rss(self) -> int:
        """Resident bytes of everything the daemon started (not multiprocessing's resource tracker)."""
        total = 0
        try:
            children = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return 0
        for child in children:
            try:
                if "resource_tracker" not in " ".join(child.cmdline()):
                    total += child.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        return total

    def sample(self) -> None:
        if self.status().get("state") == "training":
            self.rss_samples.append((time.monotonic(), self.worker_rss()))

    def stop(self) -> None:
        """Leave the run, then stop the daemon; kill its session if it lingers."""
        cli(self.home, "leave", timeout=120)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and self.status().get("state") not in ("idle", None):
            time.sleep(1)
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            pass
        kill_session(self)


def kill_session(peer: Peer) -> None:
    for pgid in {peer.process.pid, *_worker_pgid(peer.home)}:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        peer.process.wait(10)
    except subprocess.TimeoutExpired:
        pass


def _worker_pgid(home: Path) -> set[int]:
    try:
        return {int(resolve_paths(home).worker_pgid_file.read_text())}
    except (OSError, ValueError):
        return set()


def start_peer(root: Path, name: str) -> Peer:
    home = root / name
    home.mkdir(parents=True)
    (home / "config.toml").write_text(CONFIG.format(name=name))
    with open(home / "daemon.log", "w") as log:
        process = subprocess.Popen([*P2PTRAIN, "daemon", "--home", str(home)], stdout=log, stderr=subprocess.STDOUT,
                                   env=environment(), start_new_session=True)
    peer = Peer(name, home, process)
    wait_for(lambda: peer.status(), 60, f"{name} to answer")
    return peer


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(1)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")


def averaging_counts(home: Path) -> tuple[int, int]:
    """(epochs this peer finished, of them averaged with at least one other peer)."""
    with sqlite3.connect(f"file:{resolve_paths(home).database}?mode=ro", uri=True) as connection:
        epochs = connection.execute("SELECT count(*) FROM epochs").fetchone()[0]
        averaged = 0
        for (data,) in connection.execute("SELECT data FROM events WHERE kind = 'averaged'"):
            averaged += (json.loads(data or "{}").get("peers") or 0) >= 2
    return epochs, min(averaged, epochs)


def growth_mib_per_minute(samples: list[tuple[float, int]]) -> float | None:
    if len(samples) < 2 or samples[-1][0] - samples[0][0] < 60:
        return None
    (t0, rss0), (t1, rss1) = samples[0], samples[-1]
    return (rss1 - rss0) / 2**20 / ((t1 - t0) / 60)


def soak(peers: int, minutes: float, churn_every: float) -> dict:
    root = Path(tempfile.mkdtemp(prefix="p2p-soak-"))
    everyone: list[Peer] = []
    active: list[Peer] = []
    try:
        creator = start_peer(root, "p0")
        everyone.append(creator)
        active.append(creator)
        cli(creator.home, "join", "--new-run", "soak", *RUN)
        address = wait_for(lambda: (creator.status().get("local") or {}).get("addresses"), 300, "the run")[0]
        for index in range(1, peers):
            peer = start_peer(root, f"p{index}")
            cli(peer.home, "join", "soak", "--peers", address)
            everyone.append(peer)
            active.append(peer)
        wait_for(lambda: all(p.status().get("state") == "training" for p in active), 600, "every peer to train")
        start_epoch = (creator.status().get("run") or {}).get("epoch") or 0
        started = next_churn = next_sample = time.monotonic()
        next_churn += churn_every
        joined = left = 0
        while time.monotonic() - started < minutes * 60:
            now = time.monotonic()
            if now >= next_sample:
                for peer in active:
                    peer.sample()
                next_sample = now + SAMPLE_EVERY_S
            if now >= next_churn:
                leaving = active.pop(1)  # the oldest joiner; peer 0 is the bootstrap peer
                leaving.stop()
                left += 1
                newcomer = start_peer(root, f"p{len(everyone)}")
                cli(newcomer.home, "join", "soak", "--peers", address)
                everyone.append(newcomer)
                active.append(newcomer)
                joined += 1
                next_churn = time.monotonic() + churn_every
            time.sleep(1)
        elapsed = time.monotonic() - started
        end_epoch = (creator.status().get("run") or {}).get("epoch") or 0
    finally:
        for peer in active:
            peer.process.send_signal(signal.SIGTERM)
        for peer in everyone:
            try:
                peer.process.wait(60)
            except subprocess.TimeoutExpired:
                pass
            kill_session(peer)
    counts = [averaging_counts(peer.home) for peer in everyone]
    epochs, averaged = sum(c[0] for c in counts), sum(c[1] for c in counts)
    growth = {peer.name: growth_mib_per_minute(peer.rss_samples) for peer in everyone}
    return {
        "peers": peers, "minutes": round(elapsed / 60, 1), "churn_every_s": churn_every, "joined": joined, "left": left,
        "epochs_advanced": end_epoch - start_epoch, "epochs_per_minute": round((end_epoch - start_epoch) / (elapsed / 60), 2),
        "local_epochs": epochs, "averaged_epochs": averaged, "averaging_success_share": round(averaged / epochs, 3) if epochs else None,
        "rss_growth_mib_per_minute": {name: round(value, 2) for name, value in growth.items() if value is not None},
        "rss_mib_last": {peer.name: round(peer.rss_samples[-1][1] / 2**20) for peer in everyone if peer.rss_samples},
        "home": str(root),
    }


def markdown(result: dict) -> str:
    growth = result["rss_growth_mib_per_minute"]
    lines = [
        f"Soak: {result['peers']} peers for {result['minutes']} min, one leave + one join every {result['churn_every_s']:.0f} s "
        f"({result['left']} left, {result['joined']} joined)",
        "",
        "| measure | value |",
        "|---|---|",
        f"| epochs advanced | {result['epochs_advanced']} ({result['epochs_per_minute']} / min) |",
        f"| averaging rounds with another peer / local epochs | {result['averaged_epochs']} / {result['local_epochs']} = {result['averaging_success_share']} |",
        f"| RSS growth per peer, MiB/min (median, max; peers sampled >= 1 min) | "
        + (f"{sorted(growth.values())[len(growth) // 2]}, {max(growth.values())} |" if growth else "n/a |"),
        f"| RSS at last sample, MiB (min-max) | "
        + (f"{min(result['rss_mib_last'].values())}-{max(result['rss_mib_last'].values())} |" if result["rss_mib_last"] else "n/a |"),
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, default=6, help="daemons training at any time (default 6)")
    parser.add_argument("--minutes", type=float, default=5, help="length of the churn phase (default 5)")
    parser.add_argument("--churn-every", type=float, default=60, help="seconds between a leave + a join (default 60)")
    parser.add_argument("--json", action="store_true", help="print the raw numbers as JSON")
    args = parser.parse_args()
    if args.peers < 2 or args.minutes <= 0 or args.churn_every <= 0:
        parser.error("--peers must be at least 2, --minutes and --churn-every positive")
    result = soak(args.peers, args.minutes, args.churn_every)
    print(json.dumps(result, indent=2) if args.json else markdown(result))


if __name__ == "__main__":
    main()
