"""A year of one training worker in the daemon's database: the file's size and `metrics` query times.

Simulates what a daemon records for one worker, day after day: a step report
a second, a swarm snapshot every 5 s (this peer and ``--peers`` others), an
event a minute (checkpoints, averaging rounds...), an epoch every
``--epoch-every-s`` (default 20 s: sync epochs in the project's own runs come
every 8-40 s; an earlier version of this script used 10 minutes).
Rows go through the daemon's own writer (``Database``: its buffer and
flushes; the flush interval is 300 simulated seconds instead of the daemon's
2, the same rows in fewer transactions, so that a year takes minutes), and
every simulated hour the function the daemon's ``RetentionThread`` runs
(``storage.retention.apply_retention``, default limits) works on its own
connection, as in the daemon. The timestamps end now, so a real daemon can
be started on the result.

Then it times, on the year's file, the daemon's query functions behind the
control methods (``metrics``, ``epochs``, ``events``, ``peers``), and the same
methods through the control socket of a real daemon started on a copy of the
file. Goals: the file stays under 50 MB all year; ``metrics`` answers in
under 50 ms.

    nice -n 10 .venv/bin/python benchmarks/db_year.py [--days 365] [--epoch-every-s 20] [--peers 3] \
        [--out benchmarks/db_year_<date>.json] [--json]

``--out`` writes the results with the commit, date, machine (cores, memory) and
load average (``run_facts.py``) to a data file; ``report`` renders RESULTS.md's
tables from it (``benchmarks/results.py --write``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from run_facts import facts

from p2ptrain.paths import resolve_paths
from p2ptrain.protocol import ControlClient, DaemonNotRunning
from p2ptrain.storage import Database, queries
from p2ptrain.storage.retention import DAY_S, RetentionLimits, apply_retention
from p2ptrain.storage.schema import connect
from p2ptrain.worker_pipe import PeerRow

RUN_ID = "year"
SIMULATED_FLUSH_INTERVAL_S = 300.0
QUERY_REPEATS = 30


def _file_mib(path: Path) -> float:
    """The database and its write-ahead log, in MiB."""
    wal = path.with_name(path.name + "-wal")
    return (path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)) / 2**20


def simulate(path: Path, days: int, other_peers: int, epoch_every_s: int = 20) -> dict:
    """Write ``days`` of one worker's records, with retention every simulated hour."""
    start = time.time() - days * DAY_S
    clock = [0.0]  # simulated seconds since the start: the writer's monotonic clock
    limits = RetentionLimits()
    retention_connection = connect(path)
    retention_connection.conn.isolation_level = None
    peer_ids = [f"QmPeer{index}" for index in range(other_peers + 1)]
    sizes, retention_seconds, epoch = [], [], 0
    started = time.perf_counter()
    with Database.open(path, flush_interval_s=SIMULATED_FLUSH_INTERVAL_S, max_batch=100_000, clock=lambda: clock[0]) as db:
        db.record_run_joined(RUN_ID, {"run_id": RUN_ID, "mode": "sync"}, ts=start)
        for second in range(int(days * DAY_S)):
            clock[0] = second
            ts = start + second
            db.record_step(RUN_ID, epoch, 3.0 - second / (days * DAY_S), 8, 16.0, ts=ts, worker="gpu0")
            if second % 5 == 0:
                db.record_peers(RUN_ID, [PeerRow(peer_id=peer, nickname=peer[-5:], device="cuda:0", samples_per_second=16.0, epoch=epoch, loss=2.5) for peer in peer_ids], ts=ts)
            if second % 60 == 0:
                db.record_event("averaged", f"averaged with {other_peers + 1} peers", {"epoch": epoch, "peers": other_peers + 1}, ts=ts)
            if second % epoch_every_s == epoch_every_s - 1:
                db.record_epoch(RUN_ID, epoch, ts - epoch_every_s, ts, float(epoch_every_s), other_peers + 1, 4096, 2.5, 2.6)
                epoch += 1
            if second % 3600 == 3599:
                retention_started = time.perf_counter()
                apply_retention(retention_connection.conn, limits, now=ts)
                retention_seconds.append(time.perf_counter() - retention_started)
            if second % int(DAY_S) == int(DAY_S) - 1:
                sizes.append(_file_mib(path))
                if len(sizes) % 30 == 0:
                    print(f"day {len(sizes)}: {sizes[-1]:.1f} MiB, {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    retention_connection.close()
    return {
        "days": days,
        "other_peers": other_peers,
        "epoch_every_s": epoch_every_s,
        "simulation_s": round(time.perf_counter() - started, 1),
        "final_mib": round(_file_mib(path), 2),
        "max_daily_mib": round(max(sizes), 2),
        "daily_mib": [round(size, 2) for size in sizes],
        "retention_pass_median_s": round(statistics.median(retention_seconds), 4),
        "retention_pass_max_s": round(max(retention_seconds), 4),
        "rows": _row_counts(path),
    }


def _row_counts(path: Path) -> dict:
    connection = connect(path)
    try:
        return {table: connection.execute(f"SELECT count(*) FROM {table}").fetchone()[0] for table in ("steps", "peers", "events", "epochs")}
    finally:
        connection.close()


def _median_ms(call) -> dict:
    times = []
    for _ in range(QUERY_REPEATS):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return {"median_ms": round(statistics.median(times), 2), "max_ms": round(max(times), 2)}


def _hour_before_the_last_step(path: Path) -> float:
    connection = connect(path)
    try:
        return connection.execute("SELECT MAX(ts) FROM steps").fetchone()[0] - 3600
    finally:
        connection.close()


def time_queries(path: Path) -> dict:
    """The daemon's query functions, on its open ``Database`` as the control methods call them."""
    hour_ago = _hour_before_the_last_step(path)  # the simulation ended when it started: its data is that old now
    with Database.open(path) as db:
        db.record_step(RUN_ID, 0, 1.0, 8, 16.0, worker="gpu0")  # a buffered row, merged into every read
        return {
            "metrics (last 1000 steps)": _median_ms(lambda: queries.steps_since(db, limit=1000)),
            "metrics (run, last 1000)": _median_ms(lambda: queries.steps_since(db, limit=1000, run_id=RUN_ID)),
            "metrics (since an hour ago)": _median_ms(lambda: queries.steps_since(db, since=hour_ago, limit=1000)),
            "epochs (last 20)": _median_ms(lambda: queries.recent_epochs(db, limit=20)),
            "events (last 200)": _median_ms(lambda: queries.events_since(db, limit=200)),
            "peers (latest per peer)": _median_ms(lambda: queries.peers_table(db, RUN_ID)),
        }


def time_control_socket(path: Path) -> dict:
    """The same methods through the control socket of a real daemon started on a copy of the file."""
    home = Path(tempfile.mkdtemp(prefix="p2p-year-"))
    paths = resolve_paths(home)
    paths.state_dir.mkdir(parents=True)
    shutil.copy(path, paths.database)
    hour_ago = _hour_before_the_last_step(path)
    script = shutil.which("p2ptrain", path=os.path.dirname(sys.executable)) or "p2ptrain"
    daemon = subprocess.Popen([script, "daemon", "--home", str(home), "--log-level", "warning"], stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        client = ControlClient(str(paths.socket), timeout=30)
        for _ in range(300):
            try:
                client.call("status")
                break
            except (DaemonNotRunning, OSError):
                time.sleep(0.1)
        return {
            "metrics (default: last 1000)": _median_ms(lambda: client.call("metrics")),
            "metrics (since an hour ago)": _median_ms(lambda: client.call("metrics", since=hour_ago)),
            "epochs (default)": _median_ms(lambda: client.call("epochs")),
            "events (default)": _median_ms(lambda: client.call("events")),
            "status": _median_ms(lambda: client.call("status")),
        }
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)
        shutil.rmtree(home, ignore_errors=True)


def report(path: Path) -> str:
    """RESULTS.md's tables of an ``--out`` data file: the file and its rows, then the query times."""
    data = json.loads(path.read_text())
    days, daily = data["days"], data["daily_mib"]
    largest = max(range(len(daily)), key=daily.__getitem__)
    marks = ", ".join(f"day {day}: {daily[day - 1]:.1f}" for day in (1, 7, 30, 90, 180) if day <= len(daily))
    rows = data["rows"]
    machine = data["machine"]
    lines = [f"| {days} simulated days, an epoch every {data['epoch_every_s']} s | |", "|---|---|",
             f"| file (database + WAL) | **{data['final_mib']:.1f} MiB** at the end; at most {daily[largest]:.1f} MiB at the end "
             f"of a day (day {largest + 1}; {marks}) |",
             f"| rows at the end | steps {rows['steps']:,}, peer snapshots {rows['peers']:,}, events {rows['events']:,}, "
             f"epochs {rows['epochs']:,} |",
             f"| an hourly retention pass | median {data['retention_pass_median_s']:.2f} s, at most {data['retention_pass_max_s']:.2f} s |",
             f"| the simulation took | {data['simulation_s'] / 60:.1f} min |",
             f"| measured | commit {data['commit'][:9]}, {data['date']}, {machine['cores']} cores, {machine['memory_gib']} GiB, "
             f"load {data['load'][0]:.1f} before, {data['load_after'][0]:.1f} after (1 min) |",
             "", f"| query (median / max of {QUERY_REPEATS}, ms) | median | max |", "|---|---:|---:|"]
    for where, timings in (("query function", data["queries"]), ("control socket", data["control_socket"])):
        lines += [f"| {name}, {where} | {timing['median_ms']:.2f} | {timing['max_ms']:.2f} |" for name, timing in timings.items()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--peers", type=int, default=3, help="other peers in each swarm snapshot")
    parser.add_argument("--epoch-every-s", type=int, default=20, help="simulated seconds between two epochs (sync: 8-40 s)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", type=Path, help="write the results, commit, date, machine and load to this data file")
    parser.add_argument("--report", type=Path, help="print RESULTS.md's tables of this data file and exit")
    options = parser.parse_args()
    if options.report:
        print(report(options.report))
        return
    before = facts()
    directory = Path(tempfile.mkdtemp(prefix="p2p-db-year-"))
    try:
        path = directory / "p2ptrain.db"
        result = simulate(path, options.days, options.peers, options.epoch_every_s)
        result["queries"] = time_queries(path)
        result["control_socket"] = time_control_socket(path)
        result["load_average"] = os.getloadavg()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    if options.out:
        options.out.write_text(json.dumps({"benchmark": "db_year", **before, "load_after": facts()["load"], **result}, indent=1) + "\n")
    if options.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{result['days']} days, 1 worker + {result['other_peers']} other peers, simulated in {result['simulation_s']} s")
    print(f"file: {result['final_mib']} MiB at the end, {result['max_daily_mib']} MiB at most (end of each day); goal < 50 MB")
    print(f"rows at the end: {result['rows']}")
    print(f"hourly retention pass: median {result['retention_pass_median_s']} s, max {result['retention_pass_max_s']} s")
    for title, timings in (("query functions", result["queries"]), ("control socket", result["control_socket"])):
        print(f"{title} (median / max of {QUERY_REPEATS}, ms; goal for metrics < 50):")
        for name, timing in timings.items():
            print(f"  {name}: {timing['median_ms']} / {timing['max_ms']}")
    print(f"load average: {result['load_average']}")


if __name__ == "__main__":
    main()
