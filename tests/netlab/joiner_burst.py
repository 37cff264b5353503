"""A burst of joiners downloading the state at once, in the network lab (``donor_peer.py``): run and measured.

Joiners read the donors' declared priorities once per download, and a donor's
priority is its epoch: in the seconds after a round the first donor to reach the
new epoch is the only one there, and a burst of joiners (a swarm restarting, a
wave of volunteers) all pick it (hivemind #169: one donor choked by many
joiners). :func:`burst` builds that moment: donors with global addresses and a
shaped uplink, the first at the newest epoch and the others reaching it
``later_after_s`` into the burst, and joiners behind their own NAT routers, who
all ask for the state at once. ``tests/netlab/test_state_burst_lab.py`` checks
it; ``benchmarks/state_burst.py`` measures it with and without the limit on a
donor's serves at once.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from light_swarm import LightSwarm

PEER = Path(__file__).with_name("donor_peer.py")
FIRST_EPOCH = 5  # the late donors' epoch; the first donor's and the swarm's newest is the next


def burst(donors: int = 3, joiners: int = 5, state_mb: float = 4.0, upload_mbit: float = 8.0,
          later_after_s: float = 3.0, max_serves: int | None = None) -> dict:
    """Run one burst; returns what it measured.

    Args:
        donors: donors with global addresses; the first at the newest epoch from the start.
        joiners: joiners behind their own NAT routers, who all download at once.
        state_mb: the state's size (a serve alone takes ``state_mb * 8 / upload_mbit`` seconds).
        upload_mbit: each donor's uplink.
        later_after_s: when the other donors reach the newest epoch, in seconds after the burst began.
        max_serves: the donors' limit on serves at once; None: p2ptrain's (``averager.MAX_SERVES_AT_ONCE``),
            0: none (what hivemind does).

    Returns:
        ``serves``: each donor's serves, in seconds after the burst began; ``downloads``: each joiner's
        epoch got, source (peer id), seconds taken; ``alone_s``: one serve alone on a donor's uplink.
    """
    with LightSwarm("burst", PEER) as swarm:
        lab, root = swarm.lab, swarm.root
        go = root / "go"
        donor_hosts = [lab.add_public(f"d{index}") for index in range(donors)]
        joiner_hosts = [lab.add_home(f"j{index}") for index in range(1, joiners + 1)]
        for host in donor_hosts:
            lab.shape(host.name, upload_mbit=upload_mbit)
        common = ["--state-mb", str(state_mb), "--go", str(go)]
        if max_serves is not None:
            common += ["--max-serves", str(max_serves)]

        def donate(index: int, peers: list[str]) -> None:
            later = ("--newer-after-s", str(later_after_s)) if index else ()
            host = donor_hosts[index]
            swarm.start(host, peers, *common, "--role", "donor", "--epoch", str(FIRST_EPOCH + (index == 0)), *later,
                        "--serves", str(root / f"{host.name}.serves"))

        donate(0, [])
        bootstrap = swarm.bootstrap(donor_hosts[0])
        for index in range(1, donors):
            donate(index, bootstrap)
        for host in joiner_hosts:
            swarm.start(host, bootstrap, *common, "--role", "joiner", "--donors", str(donors),
                        "--ready", str(root / f"{host.name}.ready"), "--result", str(root / f"{host.name}.download"))
        wait_for([root / f"{host.name}.ready" for host in joiner_hosts], 240, swarm)
        go.touch()
        began = time.time()
        results = wait_for([root / f"{host.name}.download" for host in joiner_hosts], 150, swarm)
        swarm.finish()
        downloads = {}
        for host, path in zip(joiner_hosts, results):
            download = json.loads(path.read_text())
            downloads[host.name] = {"epoch": download["epoch"], "source": download["source"],
                                    "seconds": download["ended"] - download["began"]}
            if download["epoch"] is None:
                downloads[host.name]["output"] = swarm.output(host.name)
        serves = {}
        for host in donor_hosts:
            path = root / f"{host.name}.serves"
            serves[host.name] = [float(line) - began for line in path.read_text().split()] if path.exists() else []
        return {"serves": serves, "downloads": downloads, "alone_s": state_mb * 8 / upload_mbit}


def most_at_once(serves: list[float], window_s: float) -> int:
    """The most serves a donor began within ``window_s`` of each other (half a serve alone: they ran at once)."""
    return max((sum(1 for other in serves if start <= other < start + window_s) for start in serves), default=0)


def top_share(downloads: dict) -> float:
    """The share of the downloads that the donor who served most served."""
    sources = [download["source"] for download in downloads.values()]
    return max(sources.count(source) for source in set(sources)) / len(sources)


def wait_for(paths: list[Path], timeout_s: float, swarm: LightSwarm) -> list[Path]:
    """``paths`` once every one exists; fails if a peer failed or ``timeout_s`` passed first (a joiner ends
    once it wrote its download)."""
    deadline = time.monotonic() + timeout_s
    while not all(path.exists() for path in paths):
        for name, process in swarm.processes.items():
            assert process.poll() in (None, 0), f"{name} ended with {process.returncode}: {swarm.output(name)}"
        assert time.monotonic() < deadline, f"missing after {timeout_s:.0f} s: {[p.name for p in paths if not p.exists()]}"
        time.sleep(0.2)
    return paths
