"""A burst of joiners downloading the state at once: with and without a limit on a donor's serves at once (issue 25).

The network lab's burst (``tests/netlab/joiner_burst.py``): 3 donors with global
addresses and an 8 Mbit/s uplink each (a 4-MB state: 4 s to serve alone), the
first at the newest epoch and the other two reaching it 3 s into the burst, and
5 joiners behind their own NAT routers who all ask for the state at once. Each
repeat runs it twice, side by side: the donors without a limit (``--max-serves
0``, what hivemind's averager does) and with p2ptrain's (``MAX_SERVES_AT_ONCE``).
Per run: whether every joiner got the newest epoch, the most serves one donor
began within half a serve's time (they ran at once), the top donor's share, and
how long the joiners waited (mean, and the last one).

    sudo .venv/bin/python benchmarks/state_burst.py --repeats 3 --json benchmarks/state_burst_<date>.jsonl   # ~3 min
    .venv/bin/python benchmarks/state_burst.py --report benchmarks/state_burst_<date>.jsonl
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests" / "netlab")]

from run_facts import append_row, facts, read_rows  # noqa: E402
from joiner_burst import FIRST_EPOCH, burst, most_at_once, top_share  # noqa: E402

ARMS = {0: "none (hivemind's)", None: "p2ptrain's"}  # --max-serves of each arm, in words


def report(path: Path) -> str:
    """The table of a ``--json`` file's rows."""
    lines = ["| commit, date | donors' limit on serves at once | joiners with the newest epoch | most serves one donor began at once "
             "| top donor's share | joiner's wait, mean / last, s | serves per donor |",
             "|---|---|---:|---:|---:|---:|---|"]
    for row in read_rows(path):
        downloads = row["downloads"].values()
        waits = [download["seconds"] for download in downloads]
        newest = sum(1 for download in downloads if download["epoch"] == FIRST_EPOCH + 1)
        at_once = max(most_at_once(serves, row["alone_s"] / 2) for serves in row["serves"].values())
        limit = ARMS[row["max_serves"]] + (f" ({row['limit']})" if row["max_serves"] is None else "")
        lines.append(f"| {row['commit'][:7]}, {row['date'][:10]} | {limit} | {newest} of {len(waits)} | {at_once} | "
                     f"{top_share(row['downloads']):.0%} | {statistics.mean(waits):.1f} / {max(waits):.1f} | "
                     f"{' / '.join(str(len(serves)) for serves in row['serves'].values())} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each arm, alternating")
    parser.add_argument("--json", type=Path, help="append each run's row here")
    parser.add_argument("--report", type=Path, help="print the table of a --json file and exit")
    options = parser.parse_args()
    if options.report:
        print(report(options.report))
        return 0
    from p2ptrain.peers.robust.averager import MAX_SERVES_AT_ONCE

    for _ in range(options.repeats):
        for max_serves in ARMS:
            row = {"max_serves": max_serves, "limit": MAX_SERVES_AT_ONCE, **burst(max_serves=max_serves), **facts()}
            append_row(options.json, row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
