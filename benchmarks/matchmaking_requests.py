"""DHT requests of forming an averaging group: hivemind's searches against reads from the group key's holders (issue 25).

N real hivemind averagers on 127.0.0.1 (``tests/metered_peers.py``), the last
``--clients`` of them averaging as clients (never leading, as the peers behind
NAT do), average twice at once; the second round is measured. Every request
the peers' processes make is logged (``request_log``), and the averagers'
fetches of the group key and their declarations in it are counted. Each peer
has trusted its own copy as after a minute in the swarm (``local_reads``).
Both paths run in one invocation, side by side:

- ``hivemind``: hivemind's ``GroupKeyManager`` (a ``latest=True`` search at each
  fetch, a search before each declaration), with p2ptrain's paced fetches;
- ``holders``: ``install_matchmaking`` (a fetch from this peer's copy or one
  holder, declarations straight to the holders).

With ``--hiding K`` the holders path runs again with the K holders nearest to the
group key hostile: each deletes every declaration from its storage as soon as it
is stored (every 50 ms), so it answers every fetch with nothing.

    .venv/bin/python benchmarks/matchmaking_requests.py --peers 8 16 --hiding 1 --json benchmarks/matchmaking_requests_<date>.jsonl
    .venv/bin/python benchmarks/matchmaking_requests.py --report benchmarks/matchmaking_requests_<date>.jsonl
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests"), str(HERE.parent)]

from metered_peers import installed_meter, loopback_dhts  # noqa: E402
from run_facts import append_row, facts, read_rows  # noqa: E402

from p2ptrain.peers.net.local_reads import FULL_COPY_AFTER_S  # noqa: E402
from p2ptrain.peers.net.request_log import ENVIRONMENT_VARIABLE  # noqa: E402
from p2ptrain.peers.robust.matchmaking import install_matchmaking  # noqa: E402

PREFIX = "run_diloco"  # as p2ptrain names a DiLoCo run's averager
GROUP_KEY = f"{PREFIX}.0b"  # hivemind's key for a swarm that averages in one group
PATHS = ("hivemind", "holders")


@contextlib.contextmanager
def _group_keys(path: str):
    """hivemind's matchmaking in this process (and the averagers it forks meanwhile) as ``path`` says, restored after."""
    from hivemind.averaging import matchmaking

    original = matchmaking.GroupKeyManager
    install_matchmaking()
    if path == "hivemind":
        matchmaking.GroupKeyManager = original
    try:
        yield
    finally:
        matchmaking.GroupKeyManager = original


@contextlib.contextmanager
def _counted(method_name: str, counter):
    """``GroupKeyManager.<method_name>`` counting its calls in ``counter`` (shared with the forked averagers)."""
    from hivemind.averaging.key_manager import GroupKeyManager

    original = getattr(GroupKeyManager, method_name)

    async def counted(self, *args, **kwargs):
        with counter.get_lock():
            counter.value += 1
        return await original(self, *args, **kwargs)

    setattr(GroupKeyManager, method_name, counted)
    try:
        yield
    finally:
        setattr(GroupKeyManager, method_name, original)


async def _node_id(dht, node):
    """Run in a DHT process: its node's DHT id."""
    return node.node_id


async def _hide(dht, node, key: str) -> None:
    """Run in a DHT process: from now on, delete what its storage holds under ``key`` every 50 ms (a holder
    that hides every declaration from those who ask it)."""
    import asyncio

    from hivemind.dht.routing import DHTID

    key_id = DHTID.generate(source=key)

    async def keep_hiding():
        while True:
            for storage in (node.protocol.storage, node.protocol.cache):
                if key_id in storage:
                    del storage[key_id]
            await asyncio.sleep(0.05)

    node.p2ptrain_hiding = asyncio.create_task(keep_hiding())


def _hide_in_nearest(dhts, hiding: int) -> None:
    """Make the ``hiding`` DHT nodes nearest to the group key hide it (``_hide``)."""
    from hivemind.dht.routing import DHTID

    key_id = DHTID.generate(source=GROUP_KEY)
    ids = [dht.run_coroutine(_node_id) for dht in dhts]
    for index in sorted(range(len(dhts)), key=lambda index: key_id.xor_distance(ids[index]))[:hiding]:
        dhts[index].run_coroutine(functools.partial(_hide, key=GROUP_KEY))


def _average_once(averagers) -> list:
    """One round of every averager at once; each one's gathered data (None where it found no group)."""
    from hivemind.utils import get_dht_time

    when = get_dht_time() + 2.0
    controls = [averager.step(wait=False, scheduled_time=when, timeout=30.0, allow_retries=False) for averager in averagers]
    return [control.result(timeout=60.0) for control in controls]


def _logged_lines(directory: Path, since: float, until: float) -> list[list[str]]:
    """Every request-log line between two times: time, direction, kind, what, key, sent, received."""
    lines = []
    for path in directory.glob("*.tsv"):
        for line in path.read_text().splitlines():
            fields = line.split("\t")
            if since <= float(fields[0]) <= until:
                lines.append(fields)
    return lines


def measure(directory: Path, peers: int, clients: int, path: str, hiding: int = 0) -> dict:
    """One swarm's measured round (see the module docstring).

    Args:
        directory: for the peers' identities and request logs (emptied of neither: give a fresh one).
        peers: averagers in the swarm.
        clients: how many of them average as clients.
        path: "hivemind" or "holders" (``PATHS``).
        hiding: how many of the group key's nearest holders hide it (see the module docstring).

    Returns:
        ``group_sizes`` (each averager's group in the measured round, 0 where none), ``averaged_right``
        (each ended with the swarm's mean), ``fetches`` and ``declarations`` of the group key, its DHT
        requests by handler (``requests``: rpc_find, rpc_store) and their bytes (``request_bytes``), the
        meter's kinds of those requests (``kinds``), and how each ``local_reads`` read was answered (``reads``).
    """
    import torch
    from hivemind.averaging import DecentralizedAverager

    installed_meter()
    logs = directory / "requests"
    fetches, declarations = multiprocessing.Value("i", 0), multiprocessing.Value("i", 0)
    previous = os.environ.get(ENVIRONMENT_VARIABLE)
    os.environ[ENVIRONMENT_VARIABLE] = str(logs)  # before the DHT processes fork: they log too
    averagers = []
    try:
        with _group_keys(path), _counted("get_averagers", fetches), _counted("declare_averager", declarations), \
                loopback_dhts(directory, peers) as dhts:
            try:
                for dht in dhts:  # each peer trusts its own copy as after a minute in the swarm (not waited for)
                    dht.p2ptrain_started -= FULL_COPY_AFTER_S + 1
                _hide_in_nearest(dhts, hiding)
                averagers += [DecentralizedAverager([torch.full((4,), float(index))], dht, prefix=PREFIX,
                                                    client_mode=index >= peers - clients, min_matchmaking_time=3.0,
                                                    request_timeout=1.0, allow_state_sharing=False, start=True)
                              for index, dht in enumerate(dhts)]
                _average_once(averagers)  # finds each key's holders (one search a peer, remembered 30 s)
                fetches.value = declarations.value = 0
                started = time.time()
                gathered = _average_once(averagers)
                ended = time.time()
                mean = torch.full((4,), (peers - 1) / 2)
                averaged_right = []
                for averager in averagers:
                    with averager.get_tensors() as tensors:
                        averaged_right.append(bool(torch.allclose(tensors[0], mean)))
            finally:
                for averager in averagers:
                    averager.shutdown()
    finally:
        if previous is None:
            os.environ.pop(ENVIRONMENT_VARIABLE, None)
        else:
            os.environ[ENVIRONMENT_VARIABLE] = previous
    lines = _logged_lines(logs, started, ended)
    calls = [fields for fields in lines if fields[1] == "call" and fields[4] == GROUP_KEY]
    handlers = ("rpc_find", "rpc_store")
    reads = [fields[3].split(":")[0] for fields in lines if fields[1] == "read" and fields[4] == GROUP_KEY]
    return {"peers": peers, "clients": clients, "path": path, "hiding": hiding, "round_s": ended - started,
            "group_sizes": [len(each) if each else 0 for each in gathered], "averaged_right": averaged_right,
            "fetches": fetches.value, "declarations": declarations.value,
            "requests": {name: sum(1 for fields in calls if fields[3].endswith(name)) for name in handlers},
            "request_bytes": {name: sum(int(fields[5]) + int(fields[6]) for fields in calls if fields[3].endswith(name))
                              for name in handlers},
            "kinds": sorted({fields[2] for fields in calls}), "reads": {how: reads.count(how) for how in sorted(set(reads))}}


def report(path: Path) -> str:
    """The table of a ``--json`` file's rows."""
    lines = ["| commit, date | peers (clients) | group key read by | groups formed (sizes) | fetches / declarations | "
             "rpc_find | rpc_store | DHT requests a fetch or declaration | their KB | reads: own copy / one holder |",
             "|---|---:|---|---|---:|---:|---:|---:|---:|---:|"]
    for row in read_rows(path):
        for found in row["paths"]:
            sizes = sorted(set(found["group_sizes"]))
            operations = found["fetches"] + found["declarations"]
            requests = sum(found["requests"].values())
            reads = found["reads"]
            path_shown = found["path"] + (f", {found['hiding']} hiding" if found.get("hiding") else "")
            lines.append(f"| {row['commit'][:7]}, {row['date'][:10]} | {found['peers']} ({found['clients']}) | {path_shown} | "
                         f"{', '.join(map(str, sizes))} | {found['fetches']} / {found['declarations']} | "
                         f"{found['requests']['rpc_find']} | {found['requests']['rpc_store']} | {requests / operations:.1f} | "
                         f"{sum(found['request_bytes'].values()) / 1000:.1f} | "
                         f"{reads.get('local', 0)} / {reads.get('holders', 0)} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, nargs="+", default=[8], help="swarm sizes measured, each with both paths")
    parser.add_argument("--clients", type=float, default=0.25, help="share of each swarm averaging as clients")
    parser.add_argument("--hiding", type=int, default=0, help="also run the holders path with this many hiding holders")
    parser.add_argument("--json", type=Path, help="append the row here")
    parser.add_argument("--report", type=Path, help="print the table of a --json file and exit")
    options = parser.parse_args()
    if options.report:
        print(report(options.report))
        return 0
    found = []
    for peers in options.peers:
        for path, hiding in [(path, 0) for path in PATHS] + ([("holders", options.hiding)] if options.hiding else []):
            with tempfile.TemporaryDirectory(prefix="matchmaking-requests-") as directory:
                found.append(measure(Path(directory), peers, round(options.clients * peers), path, hiding))
    append_row(options.json, {"benchmark": "matchmaking_requests", "paths": found, **facts()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
