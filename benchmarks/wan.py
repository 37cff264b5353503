"""WAN benchmark: 4 real peers in the network lab over shaped links, sync against DiLoCo.

One public peer creates the run and three volunteers, each behind its own NAT
router, join it with the run's name and the public address (the lab of
``tests/netlab/lab.py``: isolated namespaces, needs root, iproute2, iptables).
Every peer's line is shaped: ``--upload-mbit`` up, ``--download-mbit`` down and
``--loss-pct`` percent of packets lost each way (no delay: this kernel has no
netem, see the lab's docstring). For each mode it measures:

- wall-clock time from the run's creation until the creator records a
  validation loss at or below ``--target-loss`` (its ``epochs`` table), and
  when all 4 peers were training: both modes pay the same joining time (the
  creator trains alone until the volunteers behind NAT have joined);
- bytes on the wire per sample trained: everything the four lines carried
  (sent + received: the routers' forwarding counters for the homes, ``eth0``
  for the public host) over the samples the four contributed from "all 4
  train" until the target was reached, and at least ``--wire-window-s``;
- the background rate: every peer paused for ``--pause-s`` seconds, bytes per
  second per peer on its line, and what the peers' own meters attribute to
  each kind (``status.local.traffic``) while they trained.

    sudo .venv/bin/python benchmarks/wan.py --modes sync diloco --json wan.jsonl
    sudo .venv/bin/python benchmarks/wan.py --modes sync --background-only   # the background alone
    sudo .venv/bin/python benchmarks/wan.py --modes sync --background-only --request-log /tmp/requests
    .venv/bin/python benchmarks/request_counts.py /tmp/requests --since T0 --until T1   # which requests cost it

Numbers depend on this machine's load: each row of ``--json`` has the load, the commit,
date and machine (``run_facts.py``). ``--report FILE`` prints the table of a ``--json``
file that RESULTS.md shows, ``--background-report FILE`` its background table
(``benchmarks/results.py`` renders both there).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "netlab")]

from lab import Lab  # noqa: E402
from lab_rows import end_lab, measure_each  # noqa: E402
from run_facts import read_rows  # noqa: E402
from swarm import run_cli, start_on  # noqa: E402

from p2ptrain.paths import resolve_paths  # noqa: E402
from p2ptrain.peers.net.request_log import ENVIRONMENT_VARIABLE as REQUEST_LOG  # noqa: E402

MODES = {
    "sync": ["--mode", "sync", "--target-batch-size", "256"],
    # an outer step waits for all 4 peers: 4 x 20 inner steps x 8 samples
    "diloco": ["--mode", "diloco", "--local-steps", "20", "--target-batch-size", "640"],
}


def line_counts(lab: Lab, name: str) -> tuple[int, int]:
    """Bytes (sent, received) on host ``name``'s line to the internet so far."""
    host = lab.hosts[name]
    counts = host.router.uplink_bytes() if host.router is not None else host.interface_bytes()
    return counts["sent"], counts["received"]


def line_bytes(lab: Lab, name: str) -> int:
    return sum(line_counts(lab, name))


def line_rates(lab: Lab, names, seconds: float) -> dict[str, dict[str, float]]:
    """Each host's line rates ``{sent, received}`` in bytes per second over the next ``seconds``."""
    before = {name: line_counts(lab, name) for name in names}
    moment = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - moment
    return {name: {"sent": (line_counts(lab, name)[0] - before[name][0]) / elapsed,
                   "received": (line_counts(lab, name)[1] - before[name][1]) / elapsed} for name in names}


def contributed(daemons: dict) -> int:
    return sum(int((daemon.status().get("local") or {}).get("contributed_samples") or 0) for daemon in daemons.values())


def best_val_loss(daemon, run: str) -> float | None:
    with sqlite3.connect(resolve_paths(daemon.home).database) as connection:
        row = connection.execute("SELECT min(val_loss) FROM epochs WHERE run_id = ? AND val_loss IS NOT NULL",
                                 [run]).fetchone()
    return row[0]


def reached_at(daemon, run: str, target: float) -> float | None:
    """When (Unix time) the creator's first epoch at or below validation loss ``target`` ended, or None."""
    with sqlite3.connect(resolve_paths(daemon.home).database) as connection:
        row = connection.execute("SELECT min(ended_at) FROM epochs WHERE run_id = ? AND val_loss <= ?",
                                 [run, target]).fetchone()
    return row[0]


def paused(daemon) -> bool:
    """``p2ptrain pause`` on ``daemon``; False where the CLI failed or had no answer in 2 minutes (a loaded
    machine; the daemon may still pause): the row names those peers (``not_paused``) instead of losing what
    was measured while they trained, and the paused lines show whether they went quiet."""
    try:
        return run_cli(daemon, "pause").returncode == 0
    except subprocess.TimeoutExpired:
        return False


def measure(mode: str, options, root: Path) -> dict:
    """One mode: a fresh lab and four daemons; returns the row of the results table."""
    lab = Lab(tag=mode[:2])
    daemons = {}
    try:
        hosts = [lab.add_public("pub")] + [lab.add_home(f"h{index}") for index in (1, 2, 3)]
        for host in hosts:
            lab.shape(host.name, options.upload_mbit, options.download_mbit, options.loss_pct)
            env = {REQUEST_LOG: str(options.request_log / host.name)} if options.request_log else None
            daemons[host.name] = start_on(host, root / mode, env=env)
        run = f"wan-{mode}"
        created = time.time()
        joined = run_cli(daemons["pub"], "join", "--new-run", run, "--micro-batch", "8", *MODES[mode])
        assert joined.returncode == 0, joined.stderr
        address = daemons["pub"].wait_until(lambda s: (s.get("local") or {}).get("addresses"), 600,
                                            what="the run")["local"]["addresses"][0]
        for name in ("h1", "h2", "h3"):
            assert run_cli(daemons[name], "join", run, "--peers", address).returncode == 0
        for daemon in daemons.values():
            daemon.wait_until(lambda s: s["state"] == "training" and (s.get("run") or {}).get("num_peers") == 4,
                              900, interval=2, what="4 peers training")
        started, bytes_before, samples_before = time.time(), sum(line_bytes(lab, h.name) for h in hosts), contributed(daemons)
        reached = None
        while True:
            now = time.time()
            if options.background_only:
                if now - started >= options.train_s:
                    break
            else:
                if reached is None and (moment := reached_at(daemons["pub"], run, options.target_loss)) is not None:
                    reached = moment - created
                if (reached is not None and now - started >= options.wire_window_s) or now - created >= options.timeout_s:
                    break
            time.sleep(5)
        elapsed = time.time() - started
        wire = sum(line_bytes(lab, h.name) for h in hosts) - bytes_before
        samples = contributed(daemons) - samples_before
        peer_kinds = {name: ((daemon.status().get("local") or {}).get("traffic") or {}).get("bytes_per_s") or {}
                      for name, daemon in daemons.items()}
        measured_until, load_while_training = time.time(), os.getloadavg()  # the meters' rates: their last minute
        kinds = {kind: sum(rates.get(kind, 0.0) for rates in peer_kinds.values()) / len(daemons)
                 for kind in {kind for rates in peer_kinds.values() for kind in rates}}
        training_lines = line_rates(lab, daemons, options.sample_s)
        not_paused = [name for name, daemon in daemons.items() if not paused(daemon)]
        time.sleep(options.settle_s)
        paused_lines = line_rates(lab, daemons, options.pause_s)
        return {
            "mode": mode, "background_only": options.background_only, "target_loss": options.target_loss,
            "reached_s_from_creation": reached,
            "all_training_s_from_creation": started - created, "wire_window_s": elapsed,
            "best_val_loss": best_val_loss(daemons["pub"], run), "samples": samples, "wire_bytes": wire,
            "wire_bytes_per_sample": wire / samples if samples else None,
            "training_kinds_bytes_per_s": kinds, "training_peer_kinds_bytes_per_s": peer_kinds,
            "training_line_bytes_per_s": training_lines, "measured_window": [measured_until - 60, measured_until],
            "paused_line_bytes_per_s": paused_lines, "not_paused": not_paused,
            "shaping": {"upload_mbit": options.upload_mbit, "download_mbit": options.download_mbit,
                        "loss_pct": options.loss_pct},
            "load_while_training": load_while_training, "load": os.getloadavg(),
        }
    finally:
        end_lab(lab, daemons.values())


def report(path: Path) -> str:
    """The WAN table of a ``--json`` file: a row per measured mode, in the file's order (``--background-only``
    rows sought no target)."""
    rows = read_rows(path)
    lines = ["| mode | target validation loss | all 4 training after | target reached after (from creation) | "
             "best validation loss | samples, all 4 training | bytes on the wire per sample (4 lines, sent + received) | "
             "1-min load at the end |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        reached = "not reached" if row["reached_s_from_creation"] is None else f"{row['reached_s_from_creation']:.0f} s"
        target = f"{row['target_loss']:g}"
        if row.get("background_only"):
            target, reached = "none (background only)", "-"
        kb = row["wire_bytes_per_sample"] / 1000
        size = f"{kb:,.0f} KB" if kb >= 100 else f"{kb:.1f} KB"
        lines.append(f"| {row['mode']} | {target} | {row['all_training_s_from_creation']:.0f} s | {reached} | "
                     f"{row['best_val_loss']:.2f} | {row['samples']:,} in {row['wire_window_s']:.0f} s | {size} | "
                     f"{row['load'][0]:.1f} |")
    return "\n".join(lines)


BACKGROUND_KINDS = ("matchmaking", "progress", "metrics", "dht")  # the budget's kinds: all but averaging and other
BACKGROUND_GOAL = 10_000.0  # bytes per second per peer (issue 16)
PUBLIC = "pub"


def _span(values) -> str:
    """A range of rates in KB/s: ``low-high``, or one value where they round alike."""
    low, high = f"{min(values) / 1000:.2f}", f"{max(values) / 1000:.2f}"
    return low if low == high else f"{low}-{high}"


def _run_label(row: dict) -> str:
    window = f"{row['wire_window_s']:.0f} s of 4 training"
    if row.get("background_only"):
        return f"{row['mode']}, background only ({window})"
    if "background_only" not in row and row["reached_s_from_creation"] is None:
        # a row of before wan.py recorded the flag, no target reached: whether one was sought is not kept
        return f"{row['mode']}, {window}, best loss {row['best_val_loss']:.2f}"
    reached = row["reached_s_from_creation"]
    outcome = "not reached" if reached is None else f"reached at {reached:.0f} s"
    return f"{row['mode']}, to loss {row['target_loss']:g} ({outcome}; {window})"


def background_report(path: Path) -> str:
    """The background table of a ``--json`` file: a row per measured run, in the file's order.

    Each peer's meter over the last minute of training (``training_peer_kinds_bytes_per_s``), KB/s
    sent + received: each budget kind's range over the peers, the sum of those kinds at the public
    peer, at the homes and its mean over the peers, the goal (<= 10 KB/s at every peer) met or not;
    ``other`` (p2pd's framing and encryption, and what the public peer relays between the homes) beside
    it, not counted; the busiest line while all were paused (and who did not answer the pause command);
    the commit and the 1-min load (when the meters were read, where the row has it, and at the row's end).
    """
    lines = ["| run | matchmaking | progress | metrics | dht | sum: pub | sum: homes | **mean of 4** | "
             "goal <= 10 KB/s at every peer | other (p2pd; not counted): pub / homes | paused: busiest line, B/s | "
             "commit, 1-min load (training; end) |", "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|"]
    for row in read_rows(path):
        peers = row["training_peer_kinds_bytes_per_s"]
        sums = {peer: sum(kinds.get(kind, 0.0) for kind in BACKGROUND_KINDS) for peer, kinds in peers.items()}
        homes = [peer for peer in peers if peer != PUBLIC]
        worst = max(sums, key=sums.get)
        goal = ("met" if sums[worst] <= BACKGROUND_GOAL else "**not met**") + f" (worst {worst}: {sums[worst] / 1000:.2f})"
        other = peers[PUBLIC].get("other", 0.0) / 1000, _span([peers[peer].get("other", 0.0) for peer in homes])
        paused = f"{max(sum(line.values()) for line in row['paused_line_bytes_per_s'].values()):.1f}"
        if row.get("not_paused"):
            paused += f" (no answer to pause: {', '.join(row['not_paused'])})"
        load = (f"{row['load_while_training'][0]:.1f}; " if "load_while_training" in row else "") + f"{row['load'][0]:.1f}"
        commit = row["commit"][:7] + ("-dirty" if row["commit"].endswith("-dirty") else "") if "commit" in row else "not kept"
        lines.append(f"| {_run_label(row)} | "
                     + " | ".join(_span([kinds.get(kind, 0.0) for kinds in peers.values()]) for kind in BACKGROUND_KINDS)
                     + f" | {sums[PUBLIC] / 1000:.2f} | {_span([sums[peer] for peer in homes])} | "
                     f"**{sum(sums.values()) / len(sums) / 1000:.2f}** | {goal} | {other[0]:.2f} / {other[1]} | "
                     f"{paused} | {commit}, {load} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", nargs="+", default=["sync", "diloco"], choices=sorted(MODES))
    parser.add_argument("--upload-mbit", type=float, default=20.0)
    parser.add_argument("--download-mbit", type=float, default=100.0)
    parser.add_argument("--loss-pct", type=float, default=0.5)
    parser.add_argument("--target-loss", type=float, default=4.0, help="validation loss to reach (nats per byte)")
    parser.add_argument("--timeout-s", type=float, default=1800.0,
                        help="give up on the target this long after the run's creation")
    parser.add_argument("--wire-window-s", type=float, default=120.0,
                        help="count bytes per sample over at least this long with all 4 training")
    parser.add_argument("--settle-s", type=float, default=30.0, help="after pausing, wait this long before measuring")
    parser.add_argument("--pause-s", type=float, default=120.0, help="measure the paused background this long")
    parser.add_argument("--sample-s", type=float, default=60.0, help="measure the lines while training this long")
    parser.add_argument("--background-only", action="store_true",
                        help="no target loss: train --train-s seconds, then measure the background")
    parser.add_argument("--train-s", type=float, default=180.0, help="with --background-only: seconds of training")
    parser.add_argument("--json", type=Path, help="append one JSON line per mode here")
    parser.add_argument("--report", type=Path, help="print the WAN table of a --json file and exit")
    parser.add_argument("--background-report", type=Path, help="print the background table of a --json file and exit")
    parser.add_argument("--request-log", type=Path,
                        help="log every request of each peer under this directory (benchmarks/request_counts.py)")
    options = parser.parse_args()
    if options.report:
        print(report(options.report))
        return 0
    if options.background_report:
        print(background_report(options.background_report))
        return 0
    return measure_each(options.modes, lambda mode, root: measure(mode, options, root), options.json, "p2ptrain-wan-")

if __name__ == "__main__":
    sys.exit(main())
