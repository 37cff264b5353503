"""Scale lab: how each peer's costs grow with the swarm, N real daemons in the network lab (issue 25).

For each N in ``--peers``: a fresh lab (``tests/netlab/lab.py``: isolated
namespaces, needs root, iproute2, iptables), ``--public`` public peers (the
first creates a sync run) and the rest volunteers, each behind its own NAT
router, that join it with the run's name and the first public address, as a
volunteer would. Every daemon trains the built-in model with one torch thread.
With ``--churn`` the volunteers behind NAT come and go during the window on a
random schedule (``churn.py``: exponential sessions and absences, some of
them a pause and resume). It measures, per N:

- join: seconds from a volunteer's ``join`` until its status first counts a
  contributed sample (mean and worst over the volunteers); with churn, the
  same for every return in the window (``join`` again, or ``resume``);
- state downloads: every ``state-downloaded`` event of the swarm and the peer
  that served it (only the public peers can: a peer behind NAT averages as a
  client, and a client shares no state);
- rounds: the epochs the creator recorded in the window, their duration
  (mean and spread), and for each peer the rounds it averaged in over the
  epochs that ended while it was training (from its first contribution of a
  session to the end of the session), the group sizes it averaged with
  (its ``averaged`` events), and the rounds it missed or took part in only
  partly, by reason (its ``averaging-failed`` and ``averaging-incomplete`` events);
- used ÷ trained: each peer's contributed samples over its trained ones since
  it joined, at the window's end (the lowest peer is the one that counts);
- traffic: bytes per second on each peer's line while all train (sent +
  received, the routers' forwarding counters; the public host's ``eth0``), and
  the background: what the peers' own meters put on anything but averaging
  (progress and metrics records, DHT upkeep, matchmaking, libp2p's own), mean
  and worst: the growth of each peer's meter totals, read every 30 s, over the
  time it trained (rows before 2026-11-29 took the mean of the meters'
  last-minute rates, which read high where a peer averages megabytes a round:
  ``Samples.background_of_minutes``, still recorded beside it). A paused peer
  costs nothing: its worker, DHT and p2pd end;
- memory: the machine's memory in use at its peak during the window (all N
  peers and the lab), which says whether a larger N fits.

This machine has 2 cores: N peers share them, so rounds get slower as N grows
for a reason a real swarm lacks, and a peer that starts (imports, calibration,
state download) waits for the CPU behind N trainers. ``--compute-share S``
sets every peer's ``policy.max_compute_share``: each trains S of the time and
rests the remainder, which leaves cores free for the ones starting, as each
volunteer's own machine would; ``--stagger-s`` spaces the volunteers' first
joins (all at once, 15 workers import torch on 2 cores together). The
per-peer *network* costs are the point.
With churn, each return's seconds are split the same way as a first join's
(``return_phases``). The first wave's joins are the swarm's formation: until the
first batch fills nobody's samples are used, so they say more about the run's
start than about a volunteer who joins a running swarm. ``--newcomers K`` holds
the last K peers behind NAT out of that wave: each joins for the first time at a
random moment of the window (a fresh daemon: no checkpoint, the whole state to
download) and stays, and their seconds are a column of their own.
Each row carries the commit, date, machine and load (``run_facts.py``).

    sudo .venv/bin/python benchmarks/scale.py --peers 2 4 8 --json benchmarks/scale_<date>.jsonl
    sudo .venv/bin/python benchmarks/scale.py --peers 8 --public 2 --churn --train-s 600 --json FILE
    sudo .venv/bin/python benchmarks/scale.py --peers 16 --public 4 --churn --compute-share 0.12 --stagger-s 5 --train-s 600 --json FILE
    sudo .venv/bin/python benchmarks/scale.py --peers 16 --public 4 --churn --newcomers 3 --compute-share 0.12 --stagger-s 5 --train-s 600 --json FILE
    .venv/bin/python benchmarks/scale.py --report benchmarks/scale_<date>.jsonl
    sudo .venv/bin/python benchmarks/scale.py --peers 8 --request-log /tmp/requests   # which requests cost it
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests"), str(ROOT / "tests" / "netlab")]

from churn import Churn, schedule  # noqa: E402
from lab import Lab  # noqa: E402
from lab_rows import end_lab, measure_each  # noqa: E402
from run_facts import read_rows  # noqa: E402
from swarm import events, run_cli, start_on  # noqa: E402
from wan import line_counts  # noqa: E402

from p2ptrain.paths import resolve_paths  # noqa: E402
from p2ptrain.peers.net.request_log import ENVIRONMENT_VARIABLE as REQUEST_LOG  # noqa: E402
from p2ptrain.peers.training.settings import ROUND_LOG_VARIABLE  # noqa: E402

RUN = "scale"
SAMPLES_PER_PEER_PER_EPOCH = 64  # the run's target batch size is N times this: a round's work per peer stays the same
SAMPLE_EVERY_S = 30.0  # rounds and meters are read this often during the window
METER_WINDOW_S = 60.0  # a peer's meters cover its last minute: read only once it trained that long


def local(daemon) -> dict:
    return daemon.status().get("local") or {}


def contributed_now(daemon) -> int | None:
    """The peer's contributed samples, or None while no worker of it trains (left, paused, joining)."""
    state = local(daemon)
    if not any(worker.get("state") == "training" for worker in state.get("workers") or []):
        return None
    return int(state.get("contributed_samples") or 0)


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


class Samples:
    """Every ``SAMPLE_EVERY_S`` during the window: each peer's averaging rounds so far, its meters' totals and
    last-minute rates, and whether it trained through the whole interval since the last sample
    (``churn.Churn.live``)."""

    def __init__(self, daemons: dict):
        self.daemons, self.rows, self._next = daemons, [], 0.0
        self.live_since: dict[str, float] = {}

    def __call__(self, live: list[str]) -> None:
        now = time.time()
        for name in list(self.live_since):
            if name not in live:
                del self.live_since[name]
        for name in live:
            self.live_since.setdefault(name, now)
        if now < self._next:
            return
        self._next = now + SAMPLE_EVERY_S
        traffic = {name: local(self.daemons[name]).get("traffic") or {} for name in self.live_since}
        self.rows.append({
            "time": now, "live_since": dict(self.live_since), "memory_used": psutil.virtual_memory().used,
            "rounds": {name: rounds_by_group_size(daemon) for name, daemon in self.daemons.items()},
            "meters": {name: traffic[name].get("bytes_per_s") or {}
                       for name in self.live_since if now - self.live_since[name] >= METER_WINDOW_S},
            "totals": {name: {key: traffic[name][key] for key in ("totals", "totals_at", "since")}
                       for name in self.live_since if traffic[name].get("totals") is not None},
        })

    def round_shares(self, creator) -> tuple[dict, dict]:
        """Per peer: the rounds it took ÷ the creator's epochs, over the intervals between samples that it
        trained through; and the group sizes of those rounds. Keeps those epochs per peer in
        ``epochs_trained_through``."""
        taken, epochs, sizes = Counter(), Counter(), {name: Counter() for name in self.daemons}
        for before, after in zip(self.rows, self.rows[1:]):
            ended = len(epochs_between(creator, before["time"], after["time"]))
            for name in self.daemons:
                if name in after["live_since"] and after["live_since"][name] <= before["time"]:
                    difference = after["rounds"][name] - before["rounds"][name]
                    taken[name] += sum(difference.values())
                    sizes[name] += difference
                    epochs[name] += ended
        self.epochs_trained_through = dict(epochs)
        shares = {name: (taken[name] / epochs[name] if epochs[name] else None) for name in self.daemons}
        return shares, {name: {str(size): count for size, count in sorted(counts.items())} for name, counts in sizes.items()}

    def meters(self) -> dict[str, dict[str, float]]:
        """Each peer's bytes per second by kind while it trained: the growth of its meters' totals over the
        intervals between samples that it trained through (the same worker at both ends), over their length.
        A round counted by hivemind and not yet by the kernel makes one interval's ``other`` low and the
        next one's high; summed, they cancel (``peers/net/traffic.py``)."""
        grown: dict[str, Counter] = {}
        seconds: Counter = Counter()
        for before, after in zip(self.rows, self.rows[1:]):
            for name, end in after["totals"].items():
                start = before["totals"].get(name)
                if (start is None or start["since"] != end["since"] or after["live_since"][name] > before["time"]
                        or end["totals_at"] <= start["totals_at"]):
                    continue
                grown.setdefault(name, Counter()).update(
                    {kind: end["totals"].get(kind, 0.0) - start["totals"].get(kind, 0.0) for kind in end["totals"]})
                seconds[name] += end["totals_at"] - start["totals_at"]
        return {name: {kind: count / seconds[name] for kind, count in kinds.items()} for name, kinds in grown.items()}

    def background(self) -> dict[str, float]:
        """Each peer's bytes per second on anything but averaging while it trained (``meters``)."""
        return {name: sum(rate for kind, rate in kinds.items() if kind != "averaging") for name, kinds in self.meters().items()}

    def background_of_minutes(self) -> dict[str, float]:
        """The same from the last-minute rates the meters report, as rows before 2026-11-29 measured it: each
        minute's ``other`` is cut at zero, so a peer that averages megabytes a round reads high."""
        rates: dict[str, list[float]] = {}
        for row in self.rows:
            for name, kinds in row["meters"].items():
                rates.setdefault(name, []).append(sum(rate for kind, rate in kinds.items() if kind != "averaging"))
        return {name: statistics.fmean(values) for name, values in rates.items()}


def peer_ids(daemons: dict) -> dict[str, str]:
    """Peer id (base58) -> name, from each peer's own address (``/p2p/<id>`` at its end)."""
    ids = {}
    for name, daemon in daemons.items():
        for address in local(daemon).get("addresses") or []:
            ids[address.rsplit("/p2p/", 1)[-1]] = name
    return ids


def missed_rounds(daemons: dict, since: float) -> dict[str, dict[str, int]]:
    """Per peer, its rounds that failed (by reason) or came back partly averaged since ``since``: why a
    peer missed the rounds the others took."""
    missed = {}
    for name, daemon in daemons.items():
        counts: Counter = Counter()
        for event in events(daemon):
            if event["ts"] >= since and event["kind"] in ("averaging-failed", "averaging-incomplete"):
                reason = (event.get("data") or {}).get("reason") or "incomplete"
                counts[reason] += int(event.get("count") or 1)
        missed[name] = dict(counts)
    return missed


def state_downloads(daemons: dict, names_of: dict[str, str], since: float) -> dict:
    """Every ``state-downloaded`` event since ``since``: how many, by which peer served, and by which peer
    made (more than its returns: it fell behind the swarm while it trained, and skipped rounds to catch up)."""
    served: Counter = Counter()
    made: Counter = Counter()
    for name, daemon in daemons.items():
        for event in events(daemon, "state-downloaded"):
            if event["ts"] >= since:
                source = (event.get("data") or {}).get("source")
                served[names_of.get(source, source or "unknown")] += int(event.get("count") or 1)
                made[name] += int(event.get("count") or 1)
    return {"count": sum(served.values()), "by_server": dict(served.most_common()), "by_peer": dict(made)}


def join_phases(daemons: dict, joined_at: dict[str, float], used_s: dict[str, float]) -> dict[str, dict]:
    """Where each first join's seconds went, from the ``join`` command: to its worker's ``calibrated`` event
    (the worker started, imported torch and hivemind, joined the DHT, was dialed back, read the manifest,
    loaded the model and timed its first passes), to ``joined`` (it downloaded the swarm's state), and to
    its first used sample (it trained until a round took its samples)."""
    return {name: phases_after(daemon, joined_at[name], used_s.get(name)) for name, daemon in daemons.items()}


def phases_after(daemon, since: float, used_s: float | None) -> dict[str, float]:
    """Seconds from ``since`` (a ``join`` or ``resume``) to the first ``calibrated`` and ``joined`` events
    of ``daemon``'s worker after it, and ``used_s`` (to its first used sample) when known."""
    found = {}
    for kind in ("calibrated", "joined"):
        times = [event["ts"] for event in events(daemon, kind) if event["ts"] >= since]
        if times:
            found[kind] = min(times) - since
    if used_s is not None:
        found["used"] = used_s
    return found


def return_phases(daemons: dict, returns: list[dict]) -> list[dict]:
    """Where each return's seconds went (``phases_after``), for the returns that contributed again."""
    return [{"peer": entry["peer"], "action": entry["action"], **phases_after(daemons[entry["peer"]], entry["at"], entry["seconds"])}
            for entry in returns if entry.get("seconds") is not None and "at" in entry]


def measure(peers: int, options, root: Path) -> dict:
    """One swarm of ``peers`` daemons in a fresh lab; returns the row of the results table."""
    lab = Lab(tag=f"s{peers}")
    daemons = {}
    try:
        publics = min(max(options.public, 1), peers)
        hosts = ([lab.add_public("pub")] + [lab.add_public(f"pub{index}") for index in range(2, publics + 1)]
                 + [lab.add_home(f"h{index}") for index in range(1, peers - publics + 1)])
        for host in hosts:
            env = {REQUEST_LOG: str(options.request_log / f"n{peers}" / host.name)} if options.request_log else {}
            if options.round_log:
                env[ROUND_LOG_VARIABLE] = "1"
            daemons[host.name] = start_on(host, root / f"n{peers}", env=env)
            if options.compute_share < 1:
                limited = run_cli(daemons[host.name], "config", "set", "policy.max_compute_share", str(options.compute_share))
                assert limited.returncode == 0, limited.stderr
        created = run_cli(daemons["pub"], "join", "--new-run", RUN, "--mode", "sync", "--micro-batch", "8",
                          "--target-batch-size", str(SAMPLES_PER_PEER_PER_EPOCH * peers))
        assert created.returncode == 0, created.stderr
        created_at = time.time()
        joined_at = {"pub": created_at}
        address = daemons["pub"].wait_until(lambda s: (s.get("local") or {}).get("addresses"), 600,
                                            what="the run")["local"]["addresses"][0]
        join_arguments = [RUN, "--peers", address]
        homes = [name for name in daemons if name.startswith("h")]
        newcomers = homes[len(homes) - min(options.newcomers, len(homes)):] if options.newcomers else []
        first_wave = {name: daemon for name, daemon in daemons.items() if name not in newcomers}
        for name in first_wave:
            if name != "pub":
                time.sleep(options.stagger_s)
                joined_at[name] = time.time()
                assert run_cli(daemons[name], "join", *join_arguments).returncode == 0
        join_s = wait_for_contributions(first_wave, joined_at, options.join_timeout_s)
        first_join_phases = join_phases(first_wave, joined_at, join_s)
        names_of = peer_ids(daemons)
        churning = [name for name in homes if name not in newcomers] if options.churn else []
        moves = schedule(churning, options.train_s, options.session_s, options.away_s, options.pause_share, options.seed,
                         newcomers, (options.newcomers_from_s, options.train_s - options.newcomers_until_end_s))
        churn = Churn(daemons, run_cli, join_arguments, contributed_now, newcomers=frozenset(newcomers))
        samples = Samples(daemons)
        lines_before = {name: line_counts(lab, name) for name in daemons}
        since = time.time()
        churn.run(moves, options.train_s, sample=samples)
        samples(churn.live())
        until = time.time()
        training_lines = {name: {"sent": (line_counts(lab, name)[0] - lines_before[name][0]) / (until - since),
                                 "received": (line_counts(lab, name)[1] - lines_before[name][1]) / (until - since)} for name in daemons}
        after = {name: local(daemon) for name, daemon in daemons.items()}
        epochs = epochs_between(daemons["pub"], since, until)
        shares, group_sizes = samples.round_shares(daemons["pub"])
        used = {name: (int(state.get("contributed_samples") or 0) / int(state["trained_samples"])
                       if state.get("trained_samples") else None) for name, state in after.items()}
        names_of.update(peer_ids(daemons))  # the newcomers'
        background = samples.background()
        returns = [entry["seconds"] for entry in churn.returns if not entry.get("first")]
        arrivals = [entry for entry in churn.returns if entry.get("first")]
        return {
            "peers": peers, "public": publics, "compute_share": options.compute_share, "stagger_s": options.stagger_s, "round_log": options.round_log,
            "train_s": until - since, "join_s": join_s, "join": spread(list(join_s.values())),
            "join_phases": first_join_phases,
            "newcomers": {"peers": newcomers, "between_s": [options.newcomers_from_s, options.train_s - options.newcomers_until_end_s],
                          "join_s": spread([entry["seconds"] for entry in arrivals if entry["seconds"] is not None]),
                          "phases": return_phases(daemons, arrivals),
                          "without_contribution": sum(entry["seconds"] is None for entry in arrivals)} if newcomers else None,
            "churn": {"session_s": options.session_s, "away_s": options.away_s, "pause_share": options.pause_share,
                      "seed": options.seed, "moves": churn.moves, "returns": churn.returns,
                      "return_phases": return_phases(daemons, [entry for entry in churn.returns if not entry.get("first")]),
                      "return_s": spread([value for value in returns if value is not None]),
                      "returns_without_contribution": sum(value is None for value in returns)} if options.churn else None,
            "state_downloads": state_downloads(daemons, names_of, created_at), "missed_rounds": missed_rounds(daemons, since),
            "epochs": len(epochs), "epoch_duration_s": spread([row["duration_s"] for row in epochs if row["duration_s"]]),
            "round_share": shares, "group_sizes": group_sizes, "used_over_trained": used,
            "epochs_trained_through": samples.epochs_trained_through,
            "rounds_taken": {name: sum(int(count) for count in sizes.values()) for name, sizes in group_sizes.items()},
            "training_line_bytes_per_s": training_lines, "meter_bytes_per_s": samples.meters(),
            "line_bytes_per_s_per_peer": spread([rates["sent"] + rates["received"] for rates in training_lines.values()]),
            "background_bytes_per_s": spread(list(background.values())),
            "background_of_minutes_bytes_per_s": spread(list(samples.background_of_minutes().values())), "window": [since, until],
            "memory_used_gib": max(row["memory_used"] for row in samples.rows) / 2**30,
            "load": os.getloadavg(),
        }
    finally:
        end_lab(lab, daemons.values())
        if options.keep_logs:
            kept = options.keep_logs / f"n{peers}"
            kept.mkdir(parents=True, exist_ok=True)
            for name, daemon in daemons.items():
                shutil.copyfile(daemon.log_path, kept / f"{name}.log")


def stayed(row: dict, rounds: int = 5) -> list[str]:
    """The peers that trained through at least ``rounds`` of the creator's epochs in the window (every
    peer, in rows measured before that was recorded)."""
    through = row.get("epochs_trained_through")
    return [name for name in row["used_over_trained"] if through is None or through.get(name, 0) >= rounds]


def mean_phases(phases: list[dict]) -> str:
    """``calibrated / joined / used``: each phase's mean seconds over ``phases`` (``phases_after``), or –."""
    means = [[found[phase] for found in phases if phase in found] for phase in ("calibrated", "joined", "used")]
    return " / ".join(f"{statistics.fmean(values):.0f}" if values else "–" for values in means) if phases else "–"


def upkeep_cell(row: dict) -> str:
    """The background less ``other`` (libp2p's framing of every stream, growing with the averaging bytes, and
    whatever else the kernel carried): what p2ptrain and hivemind send to keep the swarm, mean / worst KB/s of
    the peers; only rows whose meters are totals over the intervals each peer trained through (since 2026-11-29)."""
    if "background_of_minutes_bytes_per_s" not in row:
        return ""
    upkeep = [sum(rate for kind, rate in meters.items() if kind not in ("averaging", "other"))
              for meters in row["meter_bytes_per_s"].values()]
    return f"; upkeep {sum(upkeep) / len(upkeep) / 1000:.1f} / {max(upkeep) / 1000:.1f}" if upkeep else ""


def newcomers_cell(newcomers: dict | None) -> str:
    """``mean / worst (no sample); phases`` of the newcomers' first joins, or – in a row without them."""
    if not newcomers:
        return "–"
    timed = newcomers["join_s"]
    return ((f"{timed['mean']:.0f} s / {timed['worst']:.0f} s" if timed else "none timed")
            + f" ({newcomers['without_contribution']}); " + mean_phases(newcomers["phases"]))


def report(path: Path) -> str:
    """The scale table of a ``--json`` file: a row per N, in the file's order."""
    rows = read_rows(path)
    lines = ["| peers (public) | commit | churn: moves in the window (schedule seed) | join to first used sample, mean / worst | "
             "first joins: calibrated / joined / first used, mean s | after a return, mean / worst (no sample) | "
             "returns: calibrated / joined / first used, mean s | "
             "newcomers into the running swarm: join to first used sample, mean / worst (no sample); calibrated / joined / used, mean s | "
             "state downloads: top server's share (events naming no server) | epochs in the window | "
             "epoch duration, mean ± spread | rounds taken ÷ epochs trained through, lowest peer | "
             "used ÷ trained, lowest peer of 5 epochs or more | line KB/s per peer, mean / worst | "
             "background KB/s per peer (all but averaging), mean / worst: from the meters' totals (rows before 2026-11-29: "
             "the mean of the meters' last-minute rates, given as \"of minutes\" beside the totals' since); upkeep: the same less "
             "libp2p's `other` | 1-min load |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        shares = [share for share in row["round_share"].values() if share is not None]
        used = [row["used_over_trained"][name] for name in stayed(row) if row["used_over_trained"][name] is not None]
        duration, churn, downloads = row["epoch_duration_s"], row.get("churn"), row.get("state_downloads")
        returned = churn and churn["return_s"]
        phases, comeback = row.get("join_phases"), churn and churn.get("return_phases")
        share = row.get("compute_share", 1.0)
        # a download whose event names no server (a worker's report without one) is nobody's share
        servers = {name: count for name, count in (downloads or {}).get("by_server", {}).items() if name != "unknown"}
        unnamed = (downloads or {}).get("by_server", {}).get("unknown", 0)
        served = downloads and downloads["count"] and servers and max(servers.values()) / downloads["count"]
        lines.append(
            f"| {row['peers']} ({row.get('public', 1)}){f' at {share:.0%}' if share < 1 else ''} | {row.get('commit', '?')[:7]} | "
            + (f"{len(churn['moves'])} ({churn['seed']})" if churn else "none") + " | "
            f"{row['join']['mean']:.0f} s / {row['join']['worst']:.0f} s | "
            + mean_phases(list(phases.values()) if phases else []) + " | "
            + (f"{returned['mean']:.0f} s / {returned['worst']:.0f} s ({churn['returns_without_contribution']})" if returned else "–") + " | "
            + mean_phases(comeback or []) + " | "
            + newcomers_cell(row.get("newcomers")) + " | "
            + (f"{served:.0%} of {downloads['count']}" + (f" ({unnamed} unnamed)" if unnamed else "") if served
               else ("0" if downloads else "–")) + " | "
            f"{row['epochs']} in {row['train_s']:.0f} s | "
            + (f"{duration['mean']:.1f} ± {duration['stdev']:.1f} s" if duration else "–") + " | "
            + (f"{min(shares):.0%}" if shares else "–") + " | " + (f"{min(used):.0%}" if used else "–") + " | "
            f"{row['line_bytes_per_s_per_peer']['mean'] / 1000:.0f} / {row['line_bytes_per_s_per_peer']['worst'] / 1000:.0f} | "
            f"{row['background_bytes_per_s']['mean'] / 1000:.1f} / {row['background_bytes_per_s']['worst'] / 1000:.1f}"
            + (f" (of minutes: {minutes['mean'] / 1000:.1f} / {minutes['worst'] / 1000:.1f})"
               if (minutes := row.get("background_of_minutes_bytes_per_s")) else "") + upkeep_cell(row) + " | "
            f"{row['load'][0]:.1f} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", nargs="+", type=int, default=[2, 4, 8], help="swarm sizes to measure, one lab each")
    parser.add_argument("--train-s", type=float, default=120.0, help="seconds of training measured once every peer contributed")
    parser.add_argument("--public", type=int, default=1, help="peers with a public address (the first creates the run); the rest are behind NAT")
    parser.add_argument("--churn", action="store_true", help="the peers behind NAT come and go during the window (churn.py)")
    parser.add_argument("--session-s", type=float, default=180.0, help="with --churn: mean session length, seconds (exponential)")
    parser.add_argument("--away-s", type=float, default=45.0, help="with --churn: mean absence, seconds (exponential)")
    parser.add_argument("--pause-share", type=float, default=0.25, help="with --churn: share of absences that are a pause and resume")
    parser.add_argument("--seed", type=int, default=1, help="with --churn: the schedule's seed")
    parser.add_argument("--compute-share", type=float, default=1.0,
                        help="every peer's policy.max_compute_share: below 1 the peers rest between steps and leave "
                        "cores free for the ones starting (this machine hosts all N)")
    parser.add_argument("--stagger-s", type=float, default=0.0,
                        help="seconds between the volunteers' first joins (0: all at once, each worker importing torch "
                        "and hivemind on this machine's cores at the same time)")
    parser.add_argument("--newcomers", type=int, default=0,
                        help="the last K peers behind NAT stay out of the first wave of joins and join the running swarm "
                        "for the first time during the window, once each (their join to first used sample is its own column)")
    parser.add_argument("--newcomers-from-s", type=float, default=60.0, help="with --newcomers: earliest first join, seconds into the window")
    parser.add_argument("--newcomers-until-end-s", type=float, default=180.0,
                        help="with --newcomers: latest first join, seconds before the window's end")
    parser.add_argument("--join-timeout-s", type=float, default=600.0, help="give up when a peer contributed nothing after this long")
    parser.add_argument("--json", type=Path, help="append one JSON line per N here")
    parser.add_argument("--round-log", action="store_true", help="each worker logs hivemind's optimizer status lines "
                        "(pre-scheduled rounds, epoch moves, out-of-sync checks), matchmaking debug lines and the progress records "
                        "read: keep them with --keep-logs, read them with benchmarks/round_log.py")
    parser.add_argument("--request-log", type=Path, help="log every request of each peer under DIR/n<N>/<host> "
                        "(benchmarks/request_counts.py DIR/n<N> --since and --until the row's window)")
    parser.add_argument("--keep-logs", type=Path, help="copy each daemon's log (its workers' too) to DIR/n<N>/<host>.log "
                        "before the lab is removed")
    parser.add_argument("--report", type=Path, help="print the scale table of a --json file and exit")
    options = parser.parse_args()
    if options.report:
        print(report(options.report))
        return 0
    return measure_each(options.peers, lambda peers, root: measure(peers, options, root), options.json, "p2ptrain-scale-")

if __name__ == "__main__":
    sys.exit(main())
