"""Swarms of light peers in the network lab (``progress_peer.py``, ``tracker_peer.py``): started, waited for, ended.

``LightSwarm`` holds a lab and a folder for one test; each peer is a process in
its host's namespace running one light-peer script with the arguments every
such script takes (``light_peer.arguments``), its output in ``<name>.out``.
Leaving the ``with`` block ends every peer and tears the lab down, whatever
happened.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lab import Host, Lab

ROOT = Path(__file__).resolve().parents[2]


class LightSwarm:
    """A lab and a folder for light peers.

    Args:
        tag: a short word naming the lab and the folder.
        script: the light-peer script every peer runs.
    """

    def __init__(self, tag: str, script: Path):
        self.script = script
        self.root = Path(tempfile.mkdtemp(prefix=f"p2pl-{tag}-"))
        self.stop = self.root / "stop"
        self.processes: dict[str, subprocess.Popen] = {}
        self.lab = Lab(tag=tag)

    def __enter__(self) -> LightSwarm:
        return self

    def __exit__(self, *_) -> None:
        self.stop.touch()
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)
        self.lab.teardown()
        shutil.rmtree(self.root, ignore_errors=True)

    def start(self, host: Host, peers: list[str], *arguments: str, env: dict | None = None) -> None:
        """Start ``host``'s peer, bootstrapping from ``peers`` (none: it starts the swarm), with the script's own
        ``arguments``; ``env``: variables to add to this process's."""
        argv = [sys.executable, str(self.script), "--identity", str(self.root / f"{host.name}.key"), "--addresses",
                str(self.root / f"{host.name}.json"), "--stop", str(self.stop), *arguments, "--peers", *peers]
        with open(self.root / f"{host.name}.out", "w") as output:
            self.processes[host.name] = subprocess.Popen(host.command(argv), env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
                                                         stdout=output, stderr=subprocess.STDOUT)

    def addresses(self, host: Host, timeout_s: float) -> list[str]:
        """``host``'s peer's addresses, once it wrote them (its DHT is up); fails if it ended or took too long."""
        path, process = self.root / f"{host.name}.json", self.processes[host.name]
        deadline = time.monotonic() + timeout_s
        while not path.exists() or not path.read_text():
            assert process.poll() is None, f"{host.name} ended with {process.returncode}: {self.output(host.name)}"
            assert time.monotonic() < deadline, f"no {path.name} within {timeout_s:.0f} s"
            time.sleep(0.5)
        return json.loads(path.read_text())

    def bootstrap(self, host: Host, timeout_s: float = 180) -> list[str]:
        """The addresses on ``host``'s lab address by which the others join its peer."""
        found = [address for address in self.addresses(host, timeout_s) if address.startswith(f"/ip4/{host.address}/")]
        assert found, f"{host.name} has no address on {host.address}"
        return found

    def start_all(self, hosts: list[Host], start) -> None:
        """Start the first host's peer (``start(host, peers)``, no peers: it starts the swarm), then every other
        joining it; returns once every peer is up."""
        start(hosts[0], [])
        bootstrap = self.bootstrap(hosts[0])
        for host in hosts[1:]:
            start(host, bootstrap)
        for host in hosts[1:]:
            self.addresses(host, 240)

    def finish(self) -> None:
        """Ask every peer to stop, and check each ended well."""
        self.stop.touch()
        for name, process in self.processes.items():
            assert process.wait(timeout=120) == 0, self.output(name)

    def output(self, name: str) -> str:
        """The end of peer ``name``'s output."""
        return (self.root / f"{name}.out").read_text(errors="replace")[-3000:]


def epoch_moves(path: Path, since: float, until: float) -> list[dict]:
    """A ``tracker_peer.py`` peer's epoch moves (its ``--epochs`` file) between ``since`` and ``until``."""
    moves = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [move for move in moves if since <= move["at"] < until]
