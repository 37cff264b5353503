"""Read the daemon logs that ``scale.py --round-log --keep-logs DIR`` kept: where a join's first round went.

    .venv/bin/python benchmarks/round_log.py DIR/n16

Three reports, one line each:

- ``join``: each ``joined`` event (a first join or a return), and the seconds
  from it to the worker's first pre-scheduled gradient round, its first request
  to a leader, its first step, its first group and its first round; ``late``
  when that round was the swarm's next one (``one epoch ahead`` in the log),
  i.e. the peer missed the group of the epoch it joined in.
- ``group``: per epoch of the peer named by ``--peer`` (default ``pub``), how
  many seconds before its step the last group it was in formed (a gradient or a
  state round's: their log lines do not tell them apart). A group formed
  long before the epoch's end is closed to peers that return meanwhile.
- ``records``: the progress records that peer read (``progress records read``
  lines): how many reads, and how many of them held a record of more than
  ``--fast`` samples/s, or one older than ``--stale`` s.

Summaries close each report. Timestamps are the log's own (UTC, one machine).
"""

from __future__ import annotations

import argparse
import datetime
import re
import statistics
from pathlib import Path

EVENTS = {  # report key: what its first line after a join contains
    "scheduled": "Pre-scheduling gradient",
    "asked": "joining the group of",
    "step": "Beginning optimizer step",
    "group": "assembled group",
    "round": "event_log: averaged:",
    "late": "one epoch ahead",
}
ENDS = ("event_log: averaged:", "event_log: leaving", "event_log: paused")
RECORD = re.compile(r"(\S+) e(\d+) (\d+) @(\d+) s ([\d.]+)/s")


def seconds(line: str, year: int) -> float | None:
    """The time of a daemon log line (``2026-11-28 10:07:03,123``) or a hivemind one (``Nov 28 10:07:03.123``,
    which carries no year: ``year`` is taken)."""
    found = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d+)", line)
    if found:
        return datetime.datetime.strptime(found[1], "%Y-%m-%d %H:%M:%S").timestamp() + int(found[2]) / 1000
    found = re.match(r"(\w{3} \d\d \d\d:\d\d:\d\d)\.(\d+)", line)
    if found:
        return datetime.datetime.strptime(f"{year} {found[1]}", "%Y %b %d %H:%M:%S").timestamp() + int(found[2]) / 1000
    return None


def timed(path: Path) -> list[tuple[float, str]]:
    """The log's lines that carry a time, with it (the daemon's and hivemind's clocks are one machine's)."""
    text = path.read_text(errors="replace")
    year = re.search(r"^(\d{4})-\d\d-\d\d ", text, re.MULTILINE)
    year = int(year[1]) if year else datetime.date.today().year
    return [(at, line) for line in text.splitlines() if (at := seconds(line, year)) is not None]


def joins(lines: list[tuple[float, str]]) -> list[dict]:
    """For each ``joined`` event: seconds from it to the first of each of ``EVENTS``, until a round, leave or pause."""
    found = []
    for index, (joined_at, line) in enumerate(lines):
        if "event_log: joined:" not in line:
            continue
        after = {"at": line[11:19]}
        for at, later in lines[index + 1:]:
            for key, text in EVENTS.items():
                if text in later and key not in after:
                    after[key] = round(at - joined_at, 1)
            if any(end in later for end in ENDS):
                break
        found.append(after)
    return found


def groups_before_steps(lines: list[tuple[float, str]]) -> list[float]:
    """Per step: seconds from the last group formed before it to the step (none when no group formed since the last).
    Gradient and state rounds log their groups alike, so either may be the last one."""
    gaps, formed = [], None
    for at, line in lines:
        if "assembled group" in line:
            formed = at
        elif "Beginning optimizer step" in line and formed is not None:
            gaps.append(round(at - formed, 1))
            formed = None
    return gaps


def record_reads(lines: list[tuple[float, str]], fast: float, stale: float) -> dict:
    """How many record reads, and how many held a record faster than ``fast`` samples/s or older than ``stale`` s."""
    reads = fast_reads = stale_reads = 0
    fastest = 0.0
    for _, line in lines:
        if "progress records read" not in line:
            continue
        records = RECORD.findall(line)
        reads += 1
        speeds = [float(record[4]) for record in records]
        fastest = max([fastest, *speeds])
        fast_reads += any(speed > fast for speed in speeds)
        stale_reads += any(int(record[3]) > stale for record in records)
    return {"reads": reads, f"with one over {fast:g}/s": fast_reads, f"with one over {stale:g} s old": stale_reads,
            "fastest": fastest}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", type=Path, help="a directory of <host>.log files (scale.py --keep-logs DIR: DIR/n<N>)")
    parser.add_argument("--peer", default="pub", help="the host whose groups and record reads are reported")
    parser.add_argument("--fast", type=float, default=20.0, help="samples/s above which a record's speed is counted")
    parser.add_argument("--stale", type=float, default=20.0, help="seconds above which a record's age is counted")
    options = parser.parse_args()

    late = asked = 0
    all_joins = []
    for path in sorted(options.logs.glob("*.log")):
        for found in joins(timed(path)):
            print("join", path.stem, found)
            all_joins.append(found)
    for found in all_joins:
        late += "late" in found
        asked += "asked" in found and "scheduled" in found and found["asked"] - found["scheduled"] > 3.0
    print(f"joins (first joins and returns): {len(all_joins)}; first round the swarm's next one: {late}; "
          f"first leader asked more than 3 s after the round was scheduled: {asked}")

    lines = timed(options.logs / f"{options.peer}.log")
    gaps = groups_before_steps(lines)
    print("group", options.peer, gaps)
    if gaps:
        print(f"groups formed before {options.peer}'s step: median {statistics.median(gaps):.1f} s, "
              f"over 5 s before: {sum(gap > 5 for gap in gaps)} of {len(gaps)}")
    print("records", options.peer, record_reads(lines, options.fast, options.stale))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
