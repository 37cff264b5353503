"""Three real daemons, the third in a cgroup at 25 % of one core: does the slow volunteer's work count?

    sudo nice -n 10 .venv/bin/python benchmarks/slow_volunteer.py [--minutes 6] [--slow-cores 0.25] [--round-end samples]

Everything through the CLI as a volunteer types it: ``p2ptrain daemon`` three
times (each under its own temporary ``--home``, 127.0.0.1 only, one torch
thread), the third daemon moved into a CPU-quota cgroup before it starts its
worker (``tests/cpu_quota.py``; root), ``p2ptrain join --new-run`` of a DiLoCo
run with ``--local-steps 20`` on the first and ``p2ptrain join RUN --peers ADDR``
on the others. After ``--minutes`` of training it reads ``p2ptrain status
--json`` and ``p2ptrain events --json`` of every daemon and checks the issue's
bar for the slow one: at least 3 ``averaged`` events (rounds with another peer)
and ``local.contributed_samples`` >= 80 % of ``local.trained_samples``. Prints a
table and a JSON line; exits 0 when the bar is met, 1 when not.
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
sys.path.insert(0, str(HERE.parent / "tests"))

import cpu_quota  # noqa: E402  (tests/cpu_quota.py)
from daemons import cli, start_daemon, write_local_config  # noqa: E402  (tests/daemons.py)

RUN_ID = "slow-volunteer"
MICRO_BATCH = 8
LOCAL_STEPS = 20


def status_of(home: Path) -> dict:
    done = cli(home, "status", "--json")
    return json.loads(done.stdout) if done.stdout.strip() else {}


def averaged_rounds(home: Path) -> int:
    done = cli(home, "events", "--json", "--limit", "100000")
    events = json.loads(done.stdout)["events"]
    return sum(1 for event in events if event["kind"] == "averaged" and (event.get("data") or {}).get("peers", 0) >= 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=6.0, help="training time once all three train")
    parser.add_argument("--slow-cores", type=float, default=0.25, help="the third daemon's CPU quota, in cores")
    parser.add_argument("--round-end", choices=["samples", "local_steps"], default="samples",
                        help="the run's DiLoCo round_end (local_steps: the fixed H of the paper, for comparison)")
    args = parser.parse_args()
    reason = cpu_quota.unavailable()
    if reason:
        print(f"benchmarks/slow_volunteer.py {reason}: run it as root on Linux", file=sys.stderr)
        return 2
    load_before = os.getloadavg()
    quota = cpu_quota.CpuQuota(args.slow_cores, name="p2ptrain-slow-volunteer")
    daemons = []
    with tempfile.TemporaryDirectory(prefix="p2ptrain-slow-") as temp:
        try:
            for name in ("fast0", "fast1", "slow"):
                home = Path(temp) / name
                write_local_config(home)
                daemon = start_daemon(home, wait=False)
                if name == "slow":
                    quota.add(daemon.process.pid)  # the worker it starts later inherits the quota
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
            time.sleep(args.minutes * 60)
            rows = []
            for daemon in daemons:
                local = status_of(daemon.home)["local"]
                rows.append({"peer": daemon.home.name, "trained_samples": local["trained_samples"],
                             "contributed_samples": local["contributed_samples"], "unused_samples": local["unused_samples"],
                             "averaged_rounds": averaged_rounds(daemon.home), "samples_per_second": local["samples_per_second"]})
        finally:
            for daemon in daemons:
                daemon.terminate(timeout=30)
                daemon.kill()
            quota.remove(timeout=30)
    load_after = os.getloadavg()
    slow = rows[-1]
    share = slow["contributed_samples"] / max(1, slow["trained_samples"])
    met = slow["averaged_rounds"] >= 3 and share >= 0.8
    print(f"round_end {args.round_end}, {args.minutes:g} min, slow peer at {args.slow_cores:g} of a core; "
          f"1/5/15-min load before {load_before[0]:.1f}/{load_before[1]:.1f}/{load_before[2]:.1f}, "
          f"after {load_after[0]:.1f}/{load_after[1]:.1f}/{load_after[2]:.1f}")
    print("| peer | samples/s | trained | used | used share | unused (late, failed round, rejected) | averaged rounds |")
    print("|---|---:|---:|---:|---:|---|---:|")
    for row in rows:
        unused = row["unused_samples"]
        print(f"| {row['peer']} | {row['samples_per_second'] or 0:.1f} | {row['trained_samples']:,} | {row['contributed_samples']:,} | "
              f"{row['contributed_samples'] / max(1, row['trained_samples']):.0%} | {unused['late']}, {unused['failed_round']}, "
              f"{unused['rejected']} | {row['averaged_rounds']} |")
    print(f"slow peer: {slow['averaged_rounds']} averaged rounds (bar >= 3), {share:.0%} of its samples used (bar >= 80 %): "
          f"{'met' if met else 'NOT met'}")
    print(json.dumps({"round_end": args.round_end, "rows": rows, "load_before": load_before, "load_after": load_after, "met": met}))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
