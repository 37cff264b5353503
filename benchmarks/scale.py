"""Scale lab: how each peer's costs grow with the swarm, N real daemons in the network lab (issue 25).

For each N in ``--peers``: a fresh lab (``tests/netlab/lab.py``: isolated
namespaces, needs root, iproute2, iptables), one public peer that creates a
sync run and N - 1 volunteers, each behind its own NAT router, that join it
with the run's name and the public address, as a volunteer would. Every
daemon trains the built-in model with one torch thread. It measures, per N:

- join: seconds from a volunteer's ``join`` until its status first counts a
  contributed sample (mean and worst over the volunteers);
- rounds: the epochs the creator recorded while all N trained, their duration
  (mean and spread), and for each peer the rounds it averaged in over those
  epochs and the group sizes it averaged with (its ``averaged`` events);
- used ÷ trained: each peer's contributed samples over its trained ones since
  it joined, at the window's end (the lowest peer is the one that counts);
- traffic: bytes per second on each peer's line while all train (sent +
  received, the routers' forwarding counters; the public host's ``eth0``), and
  the background: what the peers' own meters put on anything but averaging
  (progress and metrics records, DHT upkeep, matchmaking, libp2p's own), mean
  and worst. A paused peer costs nothing: its worker, DHT and p2pd end.

This machine has 2 cores: N peers share them, so rounds get slower as N grows
for a reason a real swarm lacks. The per-peer *network* costs are the point.
Each row carries the commit, date, machine and load (``run_facts.py``).

    sudo .venv/bin/python benchmarks/scale.py --peers 2 4 8 --json benchmarks/scale_<date>.jsonl
    .venv/bin/python benchmarks/scale.py --report benchmarks/scale_<date>.jsonl
    sudo .venv/bin/python benchmarks/scale.py --peers 8 --request-log /tmp/requests   # which requests cost it
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests"), str(ROOT / "tests" / "netlab")]

from lab import Lab  # noqa: E402
from lab_rows import end_lab, measure_each  # noqa: E402
from run_facts import read_rows  # noqa: E402
from swarm import events, run_cli, start_on  # noqa: E402
from wan import line_rates  # noqa: E402

from p2ptrain.paths import resolve_paths  # noqa: E402
from p2ptrain.peers.net.request_log import ENVIRONMENT_VARIABLE as REQUEST_LOG  # noqa: E402

RUN = "scale"
SAMPLES_PER_PEER_PER_EPOCH = 64  # the run's target batch size is N times this: a round's work per peer stays the same


def local(daemon) -> dict:
    return daemon.status().get("local") or {}


def wait_for_contributions(daemons: dict, joined_at: dict, timeout_s: float) -> dict[str, float]:
    """Seconds from each peer's ``join`` until its status first counts a contributed sample."""
    first: dict[str, float] = {}
    deadline = time.time() + timeout_s
    while len(first) < len(daemons) and time.time() < deadline:
        for name, daemon in daemons.items():
            if name not in first and int(local(daemon).get("contributed_samples") or 0) > 0:
                first[name] = time.time() - joined_at[name]
        time.sleep(1)
    missing = sorted(set(daemons) - set(first))
    if missing:
        raise TimeoutError(f"no contributed sample after {timeout_s:.0f} s from {', '.join(missing)}")
    return first


def epochs_between(daemon, since: float, until: float) -> list[dict]:
    with sqlite3.connect(resolve_paths(daemon.home).database) as connection:
        connection.row_factory = sqlite3.Row
        rows = connection.execute("SELECT epoch, started_at, ended_at, duration_s, num_peers FROM epochs "
                                  "WHERE run_id = ? AND ended_at BETWEEN ? AND ? ORDER BY epoch", [RUN, since, until])
        return [dict(row) for row in rows]


def rounds_by_group_size(daemon) -> Counter:
    """How many averaging rounds ``daemon`` took part in so far, by group size (its ``averaged`` and
    ``averaging-incomplete`` events; a row of repeats counts each)."""
    rounds: Counter = Counter()
    for event in events(daemon):
        if event["kind"] in ("averaged", "averaging-incomplete"):
            rounds[int((event.get("data") or {}).get("peers") or 0)] += int(event.get("count") or 1)
    return rounds


def spread(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "worst": max(values), "stdev": statistics.pstdev(values)} if values else {}


def measure(peers: int, options, root: Path) -> dict:
    """One swarm of ``peers`` daemons in a fresh lab; returns the row of the results table."""
    lab = Lab(tag=f"s{peers}")
    daemons = {}
    try:
        hosts = [lab.add_public("pub")] + [lab.add_home(f"h{index}") for index in range(1, peers)]
        for host in hosts:
            env = {REQUEST_LOG: str(options.request_log / f"n{peers}" / host.name)} if options.request_log else None
            daemons[host.name] = start_on(host, root / f"n{peers}", env=env)
        created = run_cli(daemons["pub"], "join", "--new-run", RUN, "--mode", "sync", "--micro-batch", "8",
                          "--target-batch-size", str(SAMPLES_PER_PEER_PER_EPOCH * peers))
        assert created.returncode == 0, created.stderr
        joined_at = {"pub": time.time()}
        address = daemons["pub"].wait_until(lambda s: (s.get("local") or {}).get("addresses"), 600,
                                            what="the run")["local"]["addresses"][0]
        for name in daemons:
            if name != "pub":
                joined_at[name] = time.time()
                assert run_cli(daemons[name], "join", RUN, "--peers", address).returncode == 0
        join_s = wait_for_contributions(daemons, joined_at, options.join_timeout_s)
        rounds_before = {name: rounds_by_group_size(daemon) for name, daemon in daemons.items()}
        since = time.time()
        training_lines = line_rates(lab, daemons, options.train_s)
        until = time.time()
        after = {name: local(daemon) for name, daemon in daemons.items()}
        meters = {name: (state.get("traffic") or {}).get("bytes_per_s") or {} for name, state in after.items()}
        epochs = epochs_between(daemons["pub"], since, until)
        taken = {name: rounds_by_group_size(daemon) - rounds_before[name] for name, daemon in daemons.items()}
        used = {name: (int(state.get("contributed_samples") or 0) / int(state["trained_samples"])
                       if state.get("trained_samples") else None) for name, state in after.items()}
        background_training = [sum(rate for kind, rate in kinds.items() if kind != "averaging") for kinds in meters.values()]
        return {
            "peers": peers, "train_s": until - since, "join_s": join_s, "join": spread(list(join_s.values())),
            "epochs": len(epochs), "epoch_duration_s": spread([row["duration_s"] for row in epochs if row["duration_s"]]),
            "rounds_taken": {name: sum(sizes.values()) for name, sizes in taken.items()},
            "round_share": {name: (sum(sizes.values()) / len(epochs) if epochs else None) for name, sizes in taken.items()},
            "group_sizes": {name: {str(size): count for size, count in sorted(sizes.items())} for name, sizes in taken.items()},
            "used_over_trained": used,
            "training_line_bytes_per_s": training_lines, "meter_bytes_per_s": meters,
            "line_bytes_per_s_per_peer": spread([rates["sent"] + rates["received"] for rates in training_lines.values()]),
            "background_bytes_per_s": spread(background_training), "window": [since, until],
            "load": os.getloadavg(),
        }
    finally:
        end_lab(lab, daemons.values())


def report(path: Path) -> str:
    """The scale table of a ``--json`` file: a row per N, in the file's order."""
    rows = read_rows(path)
    lines = ["| peers | commit | join to first used sample, mean / worst | epochs in the window | epoch duration, mean ± spread | "
             "rounds taken ÷ epochs, lowest peer | used ÷ trained, lowest peer | line KB/s per peer training, mean / worst | "
             "background KB/s per peer (all but averaging), mean / worst | 1-min load |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        shares = [share for share in row["round_share"].values() if share is not None]
        used = [value for value in row["used_over_trained"].values() if value is not None]
        duration = row["epoch_duration_s"]
        lines.append(
            f"| {row['peers']} | {row.get('commit', '?')[:7]} | {row['join']['mean']:.0f} s / {row['join']['worst']:.0f} s | {row['epochs']} in {row['train_s']:.0f} s | "
            + (f"{duration['mean']:.1f} ± {duration['stdev']:.1f} s" if duration else "–") + " | "
            + (f"{min(shares):.0%}" if shares else "–") + " | " + (f"{min(used):.0%}" if used else "–") + " | "
            f"{row['line_bytes_per_s_per_peer']['mean'] / 1000:.0f} / {row['line_bytes_per_s_per_peer']['worst'] / 1000:.0f} | "
            f"{row['background_bytes_per_s']['mean'] / 1000:.1f} / {row['background_bytes_per_s']['worst'] / 1000:.1f} | "
            f"{row['load'][0]:.1f} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", nargs="+", type=int, default=[2, 4, 8], help="swarm sizes to measure, one lab each")
    parser.add_argument("--train-s", type=float, default=120.0, help="seconds of training measured once every peer contributed")
    parser.add_argument("--join-timeout-s", type=float, default=600.0, help="give up when a peer contributed nothing after this long")
    parser.add_argument("--json", type=Path, help="append one JSON line per N here")
    parser.add_argument("--request-log", type=Path, help="log every request of each peer under DIR/n<N>/<host> "
                        "(benchmarks/request_counts.py DIR/n<N> --since and --until the row's window)")
    parser.add_argument("--report", type=Path, help="print the scale table of a --json file and exit")
    options = parser.parse_args()
    if options.report:
        print(report(options.report))
        return 0
    return measure_each(options.peers, lambda peers, root: measure(peers, options, root), options.json, "p2ptrain-scale-")

if __name__ == "__main__":
    sys.exit(main())
