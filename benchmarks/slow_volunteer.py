"""Three real daemons, each in its own CPU quota, the third a quarter as fast: does the slow volunteer's work count?

    sudo nice -n 10 .venv/bin/python benchmarks/slow_volunteer.py [--minutes 6] [--repeats 3] \
        [--fast-cores 0.6] [--slow-cores 0.15] [--round-end samples] --json benchmarks/slow_volunteer_<date>.jsonl
    .venv/bin/python benchmarks/slow_volunteer.py --report benchmarks/slow_volunteer_<date>.jsonl

Everything through the CLI as a volunteer types it: ``p2ptrain daemon`` three
times (each under its own temporary ``--home``, 127.0.0.1 only, one torch
thread), each moved into its own CPU-quota cgroup before it starts its worker
(``tests/cpu_quota.py``; root): the two fast ones at ``--fast-cores`` of a core,
the slow one at ``--slow-cores``, so all three run under the same harness and
the slow one is slower by the quota, not by chance. ``p2ptrain join --new-run``
of a DiLoCo run with ``--local-steps 20`` on the first and ``p2ptrain join RUN
--peers ADDR`` on the others. Once all three train, it measures for
``--minutes``: each peer's speed is the samples it trained in that window over
its length (the speed ratio is the slower fast peer's over the slow one's).
Then it reads ``p2ptrain status --json`` and ``p2ptrain events --json`` of every
daemon and checks the issue's bar for the slow one: at least 3 ``averaged``
events (rounds with another peer) and ``local.contributed_samples`` >= 80 % of
``local.trained_samples``. Each repeat appends one JSON row (with the commit,
date, machine and load) to ``--json``; ``--report`` renders RESULTS.md's table
from them. Exits 0 when every repeat met the bar, 1 when one did not.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

import cpu_quota  # noqa: E402  (tests/cpu_quota.py)
from daemons import cli, start_daemon, write_local_config  # noqa: E402  (tests/daemons.py)
from run_facts import facts  # noqa: E402

RUN_ID = "slow-volunteer"
PEERS = ("fast0", "fast1", "slow")
MICRO_BATCH = 8
LOCAL_STEPS = 20


def status_of(home: Path) -> dict:
    done = cli(home, "status", "--json")
    return json.loads(done.stdout) if done.stdout.strip() else {}


def averaged_rounds(home: Path) -> int:
    """Rounds the daemon's worker averaged in with another peer: its ``averaged`` events, each row
    counting the repeats it stands for (``count``: the daemon folds repeats of one event into a row)."""
    done = cli(home, "events", "--json", "--limit", "100000")
    events = json.loads(done.stdout)["events"]
    return sum(event.get("count") or 1 for event in events
               if event["kind"] == "averaged" and (event.get("data") or {}).get("peers", 0) >= 2)


def measure(args, temp: Path) -> dict:
    """One run of the three daemons: their rows and the load around it."""
    load_before = os.getloadavg()
    quotas = {name: cpu_quota.CpuQuota(args.slow_cores if name == "slow" else args.fast_cores, name=f"p2ptrain-{name}")
              for name in PEERS}
    daemons = []
    try:
        for name in PEERS:
            home = temp / name
            write_local_config(home)
            daemon = start_daemon(home, wait=False)
            quotas[name].add(daemon.process.pid)  # the worker it starts later inherits the quota
            daemon.wait_until(lambda status: True, 60, 0.2, "the daemon to answer")
            daemons.append(daemon)
        first = daemons[0]
        created = cli(first.home, "join", "--new-run", RUN_ID, "--mode", "diloco", "--local-steps", str(LOCAL_STEPS),
                      "--micro-batch", str(MICRO_BATCH), "--target-batch-size", str(3 * MICRO_BATCH * LOCAL_STEPS),
                      "--round-end", args.round_end, timeout=60)
        if created.returncode != 0:
            raise RuntimeError(f"join --new-run failed: {created.stderr or created.stdout}")
        address = first.wait_until(lambda s: (s.get("local") or {}).get("addresses"), 600, 1, "the creator to join")["local"]["addresses"][0]
        for daemon in daemons[1:]:
            joined = cli(daemon.home, "join", RUN_ID, "--peers", address, timeout=60)
            if joined.returncode != 0:
                raise RuntimeError(f"join failed: {joined.stderr or joined.stdout}")
        for daemon in daemons:
            daemon.wait_until(lambda s: s.get("state") == "training" and (s.get("local") or {}).get("trained_samples"), 900, 2,
                              "training")
        print(f"all three train; measuring for {args.minutes:g} min", file=sys.stderr, flush=True)
        began = time.monotonic()
        before = {daemon.home.name: status_of(daemon.home)["local"]["trained_samples"] for daemon in daemons}
        time.sleep(args.minutes * 60)
        rows = []
        for daemon in daemons:
            local = status_of(daemon.home)["local"]
            rows.append({"peer": daemon.home.name, "cores": args.slow_cores if daemon.home.name == "slow" else args.fast_cores,
                         "trained_samples": local["trained_samples"], "contributed_samples": local["contributed_samples"],
                         "unused_samples": local["unused_samples"], "averaged_rounds": averaged_rounds(daemon.home),
                         "window_samples_per_second": (local["trained_samples"] - before[daemon.home.name]) / (time.monotonic() - began)})
    finally:
        for daemon in daemons:
            daemon.terminate(timeout=30)
            daemon.kill()
        for quota in quotas.values():
            quota.remove(timeout=30)
    return {"rows": rows, "load_before": load_before, "load_after": os.getloadavg()}


def verdict(row: dict) -> tuple[float, float, bool]:
    """The slow peer's used share, the speed ratio (slower fast peer ÷ slow peer) and whether the bar is met."""
    peers = {peer["peer"]: peer for peer in row["rows"]}
    slow = peers["slow"]
    share = slow["contributed_samples"] / max(1, slow["trained_samples"])
    ratio = min(peers["fast0"]["window_samples_per_second"], peers["fast1"]["window_samples_per_second"]) / max(
        slow["window_samples_per_second"], 1e-9)
    return share, ratio, slow["averaged_rounds"] >= 3 and share >= 0.8


def report(path: Path) -> str:
    """RESULTS.md's table of the rows in ``path``: every repeat's peers, then the bar per repeat."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    lines = ["| repeat | round_end | peer | CPU quota (cores) | samples/s in the window | trained | used | used share | "
             "unused (late, failed round, rejected) | averaged rounds |", "|---:|---|---|---:|---:|---:|---:|---:|---|---:|"]
    for number, row in enumerate(rows, 1):
        for peer in row["rows"]:
            unused = peer["unused_samples"]
            lines.append(f"| {number} | {row['round_end']} | {peer['peer']} | {peer['cores']:g} | {peer['window_samples_per_second']:.1f} | "
                         f"{peer['trained_samples']:,} | {peer['contributed_samples']:,} | "
                         f"{peer['contributed_samples'] / max(1, peer['trained_samples']):.0%} | {unused['late']}, "
                         f"{unused['failed_round']}, {unused['rejected']} | {peer['averaged_rounds']} |")
    lines.append("")
    for number, row in enumerate(rows, 1):
        share, ratio, met = verdict(row)
        slow = next(peer for peer in row["rows"] if peer["peer"] == "slow")
        lines.append(f"- repeat {number} ({row['date']}, commit {row['commit'][:7]}, 1-min load {row['load_before'][0]:.1f} "
                     f"before, {row['load_after'][0]:.1f} after): slow peer {ratio:.1f}x slower than the slower fast peer, "
                     f"{slow['averaged_rounds']} averaged rounds (bar >= 3), {share:.0%} of its samples used (bar >= 80 %): "
                     f"{'met' if met else 'not met'}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=6.0, help="training time measured once all three train")
    parser.add_argument("--repeats", type=int, default=1, help="runs, one after another, each a fresh swarm")
    parser.add_argument("--fast-cores", type=float, default=0.6, help="the two fast daemons' CPU quota, in cores each")
    parser.add_argument("--slow-cores", type=float, default=0.15, help="the third daemon's CPU quota, in cores")
    parser.add_argument("--round-end", choices=["samples", "local_steps"], default="samples",
                        help="the run's DiLoCo round_end (local_steps: the fixed H of the paper, for comparison)")
    parser.add_argument("--json", type=Path, help="append each repeat's row to this JSON-lines file")
    parser.add_argument("--report", type=Path, help="print the table of this file and exit")
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
        return 0
    reason = cpu_quota.unavailable()
    if reason:
        print(f"benchmarks/slow_volunteer.py {reason}: run it as root on Linux", file=sys.stderr)
        return 2
    all_met = True
    for _ in range(args.repeats):
        started = facts()
        with tempfile.TemporaryDirectory(prefix="p2ptrain-slow-") as temp:
            row = {"benchmark": "slow_volunteer", **started, "round_end": args.round_end, "minutes": args.minutes,
                   **measure(args, Path(temp))}
        share, ratio, met = verdict(row)
        all_met = all_met and met
        if args.json:
            with args.json.open("a") as file:
                file.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
        print(f"speed ratio {ratio:.1f}x, slow peer's share used {share:.0%}: {'met' if met else 'NOT met'}", file=sys.stderr, flush=True)
    return 0 if all_met else 1


if __name__ == "__main__":
    sys.exit(main())
