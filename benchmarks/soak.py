"""Soak with churn: real daemons on 127.0.0.1, one peer leaving and one joining every minute.

Peer p0 creates a run of the built-in ``tiny`` model and stays (it is the
bootstrap address); the others join through it. Every ``--churn-every``
seconds one of the others leaves, alternately with ``p2ptrain leave`` (its
daemon stays up, idle) and with SIGKILL of its daemon (not its process group:
the rough case, the daemon's worker must end by itself), and one peer joins,
alternately a new daemon and the peer that has been out longest (``join`` on
its idle daemon, or its daemon started again, which rejoins by itself).

Every minute a row records the global epoch, each peer's local epoch, the
averaging rounds attempted and succeeded in that minute over every peer's
database (attempted: finished local epochs in sync mode, ``averaged`` events
in diloco mode; succeeded: ``averaged`` events with >= 2 peers),
the resident memory (RSS) of each peer's worker, its DHT / averager children
and p2pd, and the machine's load. At the end: RSS growth per peer per 10
minutes, how long each SIGKILLed daemon's processes took to go, and whether any
process started by the benchmark is left (all carry a marker in their
environment, so orphaned p2pd processes are found too).

    nice -n 10 .venv/bin/python benchmarks/soak.py [--peers 8] [--minutes 10] [--mode sync] [--json FILE]
    .venv/bin/python benchmarks/soak.py --report FILE

``--json`` appends one JSON line per run (the commit, date, machine and load
at the start, the load at the end, every per-minute row, the kills and the
summary); ``--report`` prints RESULTS.md's sync / diloco table of such a file
(``report``, rendered by ``benchmarks/results.py`` as ``soak``) and every
run's per-minute tables (``markdown``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from p2ptrain.demo import loopback_config
from p2ptrain.paths import resolve_paths
from p2ptrain.protocol import ControlClient, DaemonNotRunning

from run_facts import facts  # benchmarks/run_facts.py, beside this script

RUNS = {
    "sync": ["--mode", "sync", "--target-batch-size", "384", "--micro-batch", "8"],
    "diloco": ["--mode", "diloco", "--local-steps", "20", "--micro-batch", "8"],
}
SAMPLE_EVERY_S = 10.0
KILL_WAIT_S = 30.0  # how long a SIGKILLed daemon's processes get to go before they count as still up
SETTLED_MINUTE = 3  # peers training are counted from this minute on (a join takes 2.5-3 min on the loaded machine)
MARKER = "P2PTRAIN_SOAK"  # environment variable every process the benchmark starts inherits
_SCRIPT = shutil.which("p2ptrain", path=os.path.dirname(sys.executable))
P2PTRAIN = [_SCRIPT] if _SCRIPT else [sys.executable, "-m", "p2ptrain.cli"]


def environment(marker: str) -> dict:
    env = {key: value for key, value in os.environ.items() if key not in ("NOTIFY_SOCKET", "P2PTRAIN_HOME")}
    env.update({"HF_HUB_OFFLINE": "1", MARKER: marker})
    return env


@dataclass
class Peer:
    """One peer's home and daemon, and what was measured of it.

    Args:
        name: the peer's nickname and directory name.
        home: its ``--home`` directory.
        marker: the value of ``P2PTRAIN_SOAK`` its processes inherit.
    """

    name: str
    home: Path
    marker: str
    process: subprocess.Popen | None = None
    # (seconds since the churn started, RSS and USS bytes summed over the worker's processes), one list per worker life
    rss_lives: list[list[tuple[float, int, int]]] = field(default_factory=list)

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([*P2PTRAIN, *args, "--home", str(self.home)], check=False, capture_output=True,
                              text=True, timeout=timeout, env=environment(self.marker))

    def start(self) -> None:
        """Start the daemon in its own session; return once it answers."""
        self.launch()
        self.wait_until_answering()

    def launch(self) -> None:
        """Start the daemon in its own session."""
        self.home.mkdir(parents=True, exist_ok=True)
        if not (self.home / "config.toml").exists():
            (self.home / "config.toml").write_text(loopback_config(self.name))
        with open(self.home / "daemon.log", "a") as log:
            self.process = subprocess.Popen([*P2PTRAIN, "daemon", "--home", str(self.home)], stdout=log,
                                            stderr=subprocess.STDOUT, env=environment(self.marker), start_new_session=True)
        self.rss_lives.append([])

    def wait_until_answering(self) -> None:
        wait_for(self.status, 60, f"{self.name}'s daemon to answer")

    def status(self) -> dict:
        try:
            return ControlClient(str(resolve_paths(self.home).socket), timeout=10).call("status")
        except (DaemonNotRunning, OSError):
            return {}

    def worker_processes(self) -> list[psutil.Process]:
        """Everything the daemon started: the worker, its DHT and averager processes, p2pd."""
        if self.process is None or self.process.poll() is not None:
            return []
        try:
            return psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def sample(self, now: float) -> None:
        if self.status().get("state") != "training":
            return
        rss = uss = 0
        for child in self.worker_processes():
            try:
                memory = child.memory_full_info()
                rss, uss = rss + memory.rss, uss + memory.uss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        self.rss_lives[-1].append((now, rss, uss))

    def leave(self) -> str:
        result = self.cli("leave", timeout=120)
        return "leave" if result.returncode == 0 else f"leave failed: {(result.stderr or result.stdout).strip()[:120]}"

    def sigkill(self) -> dict:
        """SIGKILL the daemon alone: how many processes it had started (``processes``), how many of them were
        still up ``KILL_WAIT_S`` later (``still_up``) and how long the others took to go (``gone_s``; None while some are up)."""
        started_by_it = self.worker_processes()
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)
        began = time.monotonic()
        _, alive = psutil.wait_procs(started_by_it, timeout=KILL_WAIT_S)
        alive = [p for p in alive if _running(p)]
        return {"peer": self.name, "processes": len(started_by_it), "still_up": len(alive),
                "gone_s": None if alive else round(time.monotonic() - began, 1)}

    def rejoin(self, address: str, run: str) -> str:
        """Come back: start the killed daemon again (it rejoins by itself) or join again on the idle one."""
        if self.process is None or self.process.poll() is not None:
            self.start()
            return "restarted"
        result = self.cli("join", run, "--peers", address)
        self.rss_lives.append([])
        return "rejoined" if result.returncode == 0 else f"join failed: {(result.stderr or result.stdout).strip()[:120]}"

    def end(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(1)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def database_counts(home: Path) -> dict:
    """This peer's latest local epoch, finished local epochs, averaging rounds recorded (``rounds``), of them
    with >= 2 peers (``averaged``), and state downloads, from its database."""
    counts = {"epoch": None, "epochs": 0, "rounds": 0, "averaged": 0, "downloads": 0}
    database = resolve_paths(home).database
    if not database.exists():
        return counts
    try:
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=5) as connection:
            counts["epoch"] = connection.execute("SELECT max(epoch) FROM steps").fetchone()[0]
            counts["epochs"] = connection.execute("SELECT count(*) FROM epochs").fetchone()[0]
            # a row stands for ``count`` repeats of its event (the daemon folds repeats since issue 24)
            for kind, data, repeats in connection.execute(
                    "SELECT kind, data, coalesce(count, 1) FROM events WHERE kind IN ('averaged', 'state-downloaded')"):
                if kind == "state-downloaded":
                    counts["downloads"] += repeats
                else:
                    counts["rounds"] += repeats
                    counts["averaged"] += repeats * ((json.loads(data or "{}").get("peers") or 0) >= 2)
    except sqlite3.Error:
        pass
    return counts


def processes_with_marker(marker: str) -> list[str]:
    """Processes (not zombies) whose environment carries this benchmark's marker."""
    left = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        try:
            if process.pid != os.getpid() and process.environ().get(MARKER) == marker and _running(process):
                left.append(f"{process.pid} {' '.join(process.info['cmdline'] or [])[:100]}")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return left


class Soak:
    """One soak: start the swarm, churn it every interval, record a row per minute, end everything."""

    def __init__(self, peers: int, minutes: float, churn_every: float, mode: str):
        self.size, self.minutes, self.churn_every, self.mode = peers, minutes, churn_every, mode
        self.root = Path(tempfile.mkdtemp(prefix="p2p-soak-"))
        self.marker = str(self.root)
        self.everyone: list[Peer] = []
        self.active: list[Peer] = []
        self.out: list[Peer] = []  # left or killed, oldest first
        self.rows: list[dict] = []
        self.kills: list[dict] = []
        self.churns = 0
        self.address = ""
        self.started = 0.0
        self.facts = facts()

    def new_peer(self) -> Peer:
        peer = Peer(f"p{len(self.everyone)}", self.root / f"p{len(self.everyone)}", self.marker)
        self.everyone.append(peer)
        return peer

    def run(self) -> dict:
        try:
            self.start_swarm()
            self.churn_forever()
        finally:
            load_end = [round(value, 2) for value in os.getloadavg()]
            left_behind = self.end_everything()
        return self.summary(left_behind, load_end)

    def start_swarm(self) -> None:
        creator = self.new_peer()
        creator.start()
        created = creator.cli("join", "--new-run", "soak", *RUNS[self.mode])
        if created.returncode != 0:
            raise RuntimeError(f"creating the run failed: {created.stderr.strip()}")
        self.address = wait_for(lambda: (creator.status().get("local") or {}).get("addresses"), 300, "the run")[0]
        self.active.append(creator)
        joiners = [self.new_peer() for _ in range(1, self.size)]
        for peer in joiners:
            peer.launch()
        for peer in joiners:
            peer.wait_until_answering()
            peer.cli("join", "soak", "--peers", self.address)
            self.active.append(peer)
        wait_for(lambda: all(p.status().get("state") == "training" for p in self.active), 900, "every peer to train")
        self.started = time.monotonic()
        self.record_row("all training")

    def churn_forever(self) -> None:
        next_sample = self.started
        next_churn = self.started + self.churn_every
        while self.churns < int(self.minutes * 60 // self.churn_every):
            now = time.monotonic()
            if now >= next_sample:
                for peer in self.active:
                    peer.sample(now - self.started)
                next_sample = now + SAMPLE_EVERY_S
            if now >= next_churn:
                self.record_row(self.churn())
                next_churn += self.churn_every
            time.sleep(0.5)

    def churn(self) -> str:
        """One peer leaves (leave and SIGKILL alternate), one joins (a new one and the longest out alternate)."""
        self.churns += 1
        leaving = self.active.pop(1)  # the longest in, after the creator
        if self.churns % 2:
            what = leaving.leave()
        else:
            minute = round((time.monotonic() - self.started) / 60, 1)
            kill = leaving.sigkill()
            self.kills.append({"minute": minute, **kill})
            what = (f"SIGKILL: {kill['still_up']} of {kill['processes']} processes still up after {KILL_WAIT_S:.0f} s"
                    if kill["still_up"] else f"SIGKILL: its {kill['processes']} processes gone in {kill['gone_s']:.1f} s")
        if self.churns % 2 or not self.out:
            joining = self.new_peer()
            joining.start()
            result = joining.cli("join", "soak", "--peers", self.address)
            came = "new" if result.returncode == 0 else f"new, join failed: {result.stderr.strip()[:100]}"
        else:
            joining = self.out.pop(0)
            came = joining.rejoin(self.address, "soak")
        self.out.append(leaving)
        self.active.append(joining)
        return f"{leaving.name} out ({what}); {joining.name} in ({came})"

    def record_row(self, churn: str) -> None:
        now = time.monotonic() - self.started
        statuses = {peer.name: peer.status() for peer in self.active}
        counts = {peer.name: database_counts(peer.home) for peer in self.everyone}
        totals = {key: sum(c[key] for c in counts.values()) for key in ("epochs", "rounds", "averaged", "downloads")}
        # sync records only the rounds that finished (hivemind logs failures at debug level), so every local epoch
        # counts as an attempt; diloco records every outer round, of size 1 when it failed
        totals["attempted"] = totals["epochs"] if self.mode == "sync" else totals["rounds"]
        before = self.rows[-1]["totals"] if self.rows else totals
        self.rows.append({
            "minute": round(now / 60, 1),
            "time": time.strftime("%H:%M:%S"),
            "global_epoch": max(((s.get("run") or {}).get("epoch") or 0 for s in statuses.values()), default=0),
            "peer_epochs": {name: counts[name]["epoch"] for name in statuses},
            "states": {name: s.get("state", "no answer") for name, s in statuses.items() if s.get("state") != "training"},
            "attempted": totals["attempted"] - before["attempted"],
            "succeeded": totals["averaged"] - before["averaged"],
            "downloads": totals["downloads"] - before["downloads"],
            "totals": totals,
            "rss_mib": {p.name: round(p.rss_lives[-1][-1][1] / 2**20) for p in self.active if p.rss_lives and p.rss_lives[-1]},
            "load": round(os.getloadavg()[0], 1),
            "churn": churn,
        })
        print(json.dumps(self.rows[-1]), flush=True)

    def end_everything(self) -> list[str]:
        """SIGTERM every daemon and wait; SIGKILL what is still up 20 s after the daemons ended and return it."""
        for peer in self.everyone:
            peer.end()
        deadline = time.monotonic() + 60
        for peer in self.everyone:
            if peer.process is not None:
                try:
                    peer.process.wait(max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        deadline = time.monotonic() + 20
        while (left_behind := processes_with_marker(self.marker)) and time.monotonic() < deadline:
            time.sleep(1)
        for line in left_behind:
            try:
                os.kill(int(line.split()[0]), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(2)
        return left_behind + [f"still up after SIGKILL: {line}" for line in processes_with_marker(self.marker)]

    def summary(self, left_behind: list[str], load_end: list[float]) -> dict:
        """The JSON row of the run: ``facts()`` at the start, ``load_end``, the options, every per-minute row,
        the kills and the figures over the churn phase (rows after the first)."""
        growth = {}
        for peer in self.everyone:
            for life, samples in enumerate(peer.rss_lives):
                if len(samples) >= 2 and samples[-1][0] - samples[0][0] >= 60:
                    (t0, rss0, uss0), (t1, rss1, uss1) = samples[0], samples[-1]
                    per_10_min = 2**20 * (t1 - t0) / 600
                    growth[f"{peer.name}#{life}"] = {
                        "minutes": round((t1 - t0) / 60, 1), "first_mib": round(rss0 / 2**20), "last_mib": round(rss1 / 2**20),
                        "mib_per_10_min": round((rss1 - rss0) / per_10_min, 1), "uss_mib_per_10_min": round((uss1 - uss0) / per_10_min, 1),
                    }
        attempted = sum(row["attempted"] for row in self.rows)
        succeeded = sum(row["succeeded"] for row in self.rows)
        return {
            "benchmark": "soak", **self.facts, "load_end": load_end,
            "mode": self.mode, "peers": self.size, "minutes": self.minutes, "churn_every_s": self.churn_every,
            "churns": self.churns, "rows": self.rows, "kills": self.kills,
            "attempted": attempted, "succeeded": succeeded,
            "success_share": round(succeeded / attempted, 3) if attempted else None,
            "epochs_advanced": self.rows[-1]["global_epoch"] - self.rows[0]["global_epoch"] if self.rows else 0,
            "downloads": sum(row["downloads"] for row in self.rows),
            "downloads_total": self.rows[-1]["totals"]["downloads"] if self.rows else 0,
            "rss_growth": growth, "left_behind": left_behind, "home": str(self.root),
        }


def runs(path: Path) -> list[dict]:
    """The runs of a ``--json`` file, sync before diloco, each mode's in the order they ran."""
    found = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return sorted(found, key=lambda run: list(RUNS).index(run["mode"]))


def _span(values: list) -> str:
    low, high = min(values), max(values)
    return f"{low}" if low == high else f"{low}–{high}"


def _training(row: dict) -> int:
    return len(row["peer_epochs"]) - len(row["states"])


def _column(run: dict) -> list[str]:
    """One run's cells of the comparison table, in the order of ``report``'s rows."""
    share = f" ({run['success_share']:.2f})" if run["success_share"] is not None else ""
    settled = [_training(row) for row in run["rows"] if row["minute"] >= SETTLED_MINUTE]
    growth = next((value for name, value in run["rss_growth"].items() if name.startswith("p0#")), None)
    staying = [(row["minute"], row["rss_mib"]["p0"]) for row in run["rows"] if "p0" in row["rss_mib"]]
    later = [(minute, mib) for minute, mib in staying if minute >= run["minutes"] / 2]
    if growth is None:
        rss = "not sampled for a minute"
    else:
        rss = f"{growth['mib_per_10_min']:+.0f} ({growth['first_mib']} → {growth['last_mib']} MiB in {growth['minutes']} min)"
        if len(later) >= 2:
            rss += f"; {later[-1][1] - later[0][1]:+d} MiB from minute {later[0][0]} to {later[-1][0]}"
    gone = sorted(kill["gone_s"] for kill in run["kills"] if kill["gone_s"] is not None)
    stuck = [kill for kill in run["kills"] if kill["gone_s"] is None]
    kills = [", ".join(f"{seconds:.1f}" for seconds in gone) + " s"] if gone else []
    if stuck:
        kills.append(f"{len(stuck)} with processes still up after {KILL_WAIT_S:.0f} s")
    count = len(run["kills"])
    commit = run["commit"][:9] + ("-dirty" if run["commit"].endswith("-dirty") else "")
    return [
        f"{run['peers']} peers, {run['minutes']:g} min, a churn every {run['churn_every_s']:g} s ({run['churns']} churns)",
        f"{run['epochs_advanced']}",
        f"{run['succeeded']} / {run['attempted']}{share}",
        f"{run['downloads']} ({run['downloads_total']} from the start)",
        f"{_span(settled)} of {run['peers']}" if settled else f"no row from minute {SETTLED_MINUTE}",
        rss,
        "; ".join(kills) + f" ({count} kill{'s' if count != 1 else ''})" if count else "no kill",
        f"{len(run['left_behind'])}",
        f"commit {commit}, {run['date']}, {run['machine']['cores']} cores, "
        f"load {run['load'][0]:.1f} at the start, {run['load_end'][0]:.1f} at the end (1 min)",
    ]


REPORT_ROWS = [
    "run",
    "epochs advanced during the churn",
    "averaging rounds with >= 2 peers / attempted",
    "state downloads during the churn (peers that fell behind or joined)",
    f"peers training from minute {SETTLED_MINUTE} on",
    "RSS growth of the peer that stayed (p0), MiB per 10 min",
    "a SIGKILLed daemon's processes gone after",
    "processes left behind at the end",
    "measured",
]


def report(path: Path) -> str:
    """RESULTS.md's sync / diloco table of a ``--json`` file: a column per run (every run the file holds, sync
    first; a mode that ran more than once is numbered in the order its runs were appended)."""
    found = runs(path)
    heads = []
    for run in found:
        same = [other for other in found if other["mode"] == run["mode"]]
        heads.append(run["mode"] if len(same) == 1 else f"{run['mode']} #{same.index(run) + 1}")
    columns = [_column(run) for run in found]
    lines = ["| | " + " | ".join(heads) + " |", "|---|" + "---|" * len(found)]
    for number, label in enumerate(REPORT_ROWS):
        lines.append(f"| {label} | " + " | ".join(column[number] for column in columns) + " |")
    return "\n".join(lines)


def markdown(result: dict) -> str:
    """One run's per-minute table and RSS growth per worker life."""
    lines = [
        f"### {result['mode']}, {result['peers']} peers, {result['churns']} churns",
        "",
        f"Commit {result['commit']}, {result['date']}; load averages (1, 5, 15 min) at the start: {result['load']}, "
        f"at the end: {result['load_end']}; the peers' homes: `{result['home']}`",
        "",
        f"Epochs advanced: **{result['epochs_advanced']}**; averaging rounds succeeded / attempted: "
        f"**{result['succeeded']} / {result['attempted']}** (share {result['success_share']}). "
        f"Processes left behind: **{len(result['left_behind'])}**" + (f" ({'; '.join(result['left_behind'])})" if result["left_behind"] else "") + ".",
        "",
        "| min | time | training | global epoch | local epoch per peer | rounds ok / tried | state downloads | RSS per peer, MiB | load 1m | churn |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        epochs = " ".join(f"{name}:{epoch}" for name, epoch in row["peer_epochs"].items())
        if row["states"]:
            epochs += " (" + ", ".join(f"{name} {state}" for name, state in row["states"].items()) + ")"
        rss = " ".join(f"{name}:{mib}" for name, mib in row["rss_mib"].items())
        training = f"{_training(row)} of {len(row['peer_epochs'])}"
        lines.append(f"| {row['minute']} | {row.get('time', '')} | {training} | {row['global_epoch']} | {epochs} | {row['succeeded']} / {row['attempted']} "
                     f"| {row['downloads']} | {rss} | {row['load']} | {row['churn']} |")
    lines += ["", "RSS growth per worker life sampled for at least a minute (worker + DHT/averager + p2pd):", "",
              "| peer#life | minutes sampled | first RSS MiB | last RSS MiB | RSS MiB per 10 min | USS MiB per 10 min |",
              "|---|---|---|---|---|---|"]
    for name, value in result["rss_growth"].items():
        lines.append(f"| {name} | {value['minutes']} | {value['first_mib']} | {value['last_mib']} | {value['mib_per_10_min']} "
                     f"| {value['uss_mib_per_10_min']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, default=8, help="peers in the run (training or joining) at any time (default 8)")
    parser.add_argument("--minutes", type=float, default=10, help="length of the churn phase in minutes (default 10)")
    parser.add_argument("--churn-every", type=float, default=60, help="seconds between one leave + one join (default 60)")
    parser.add_argument("--mode", choices=sorted(RUNS), default="sync", help="the run's training mode (default sync)")
    parser.add_argument("--json", type=Path, help="append the run's JSON line to this file")
    parser.add_argument("--report", type=Path, help="print the sync / diloco table and every run's tables of this file, and exit")
    args = parser.parse_args()
    if args.report:
        print(report(args.report) + "\n\n" + "\n".join(markdown(run) for run in runs(args.report)))
        return
    if args.peers < 3 or args.minutes <= 0 or args.churn_every <= 0 or args.minutes * 60 < args.churn_every:
        parser.error("--peers must be at least 3; --minutes and --churn-every positive, --minutes at least one churn long")
    result = Soak(args.peers, args.minutes, args.churn_every, args.mode).run()
    if args.json:
        with args.json.open("a") as file:
            file.write(json.dumps(result) + "\n")
    print(markdown(result))
    if result["left_behind"]:
        sys.exit(f"{len(result['left_behind'])} processes were left behind")


if __name__ == "__main__":
    main()
