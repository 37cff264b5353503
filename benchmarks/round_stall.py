"""A group member that freezes mid-round: how long the others wait, with fixed deadlines and with deadlines from recent rounds (issue 25).

Eight real DiLoCo averagers on 127.0.0.1 (``tests/stalled_round.py``), with the
internet's round timeout (120 s, ``sync.INTERNET_AVERAGING``), average three
rounds together; in the fourth one member's averager process is stopped once
its group formed. Each repeat runs it twice, side by side: hivemind's fixed
deadlines (no deadline per member in DiLoCo's averager: the round's timeout) and
p2ptrain's, set from the recent rounds (``RobustAverager._stall_deadlines``).

    .venv/bin/python benchmarks/round_stall.py --repeats 3 --json benchmarks/round_stall_<date>.jsonl   # ~8 min
    .venv/bin/python benchmarks/round_stall.py --report benchmarks/round_stall_<date>.jsonl
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

from run_facts import append_row, facts, read_rows  # noqa: E402

PEERS = 8
ARMS = {False: "fixed (hivemind's)", True: "from recent rounds"}


def report(path: Path) -> str:
    """The table of a ``--json`` file's rows."""
    lines = ["| commit, date | deadline for a member that sent nothing | rounds before, s (mean) | the others' round with a "
             "member stopped: s until it ended | of the others, averaged | deadline, s |",
             "|---|---|---:|---:|---:|---:|"]
    for row in read_rows(path):
        deadlines = set(row["deadlines"])
        shown = ", ".join("none" if deadline is None else f"{deadline:g}" for deadline in sorted(deadlines, key=lambda d: d or 0))
        lines.append(f"| {row['commit'][:7]}, {row['date'][:10]} | {ARMS[row['adapt']]} | {statistics.mean(row['rounds_s']):.2f} | "
                     f"{row['seconds']:.1f} | {row['averaged']} of {row['peers'] - 1} | {shown} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each arm, alternating")
    parser.add_argument("--round-timeout-s", type=float, default=120.0, help="the averagers' round timeout")
    parser.add_argument("--json", type=Path, help="append each run's row here")
    parser.add_argument("--report", type=Path, help="print the table of a --json file and exit")
    options = parser.parse_args()
    if options.report:
        print(report(options.report))
        return 0
    from stalled_round import stalled_round

    for _ in range(options.repeats):
        for adapt in ARMS:
            row = {"adapt": adapt, "peers": PEERS, "round_timeout_s": options.round_timeout_s,
                   **stalled_round(PEERS, options.round_timeout_s, adapt=adapt), **facts()}
            append_row(options.json, row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
