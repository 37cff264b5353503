"""Which requests make a peer's background traffic: the request logs of a lab run, summed by key.

``benchmarks/wan.py --request-log DIR`` runs every peer with
``P2PTRAIN_REQUEST_LOG=DIR/<host>`` (``p2ptrain/peers/net/request_log.py``); this
reads those logs and prints, per peer, the requests that cost the most bytes
per second over a window: direction (``call``: this peer asked, ``serve``: it
answered, ``stream``: averaging and matchmaking messages), kind, handler or
message, and key; then how its record reads were answered (its own copy, or
the network and why). A server sees only a key's hash; it is named here after the
keys the callers logged (``DHTID`` of the key string).

    .venv/bin/python benchmarks/request_counts.py DIR --since T0 --until T1 [--top 15]

``wan.py`` writes the window it measured (``measured_window``) into its JSON line.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path


def read_lines(directory: Path, since: float, until: float):
    """``(time, direction, kind, what, key, sent, received)`` of every log line of one peer within the window."""
    for path in sorted(directory.glob("*.tsv")):
        for line in path.read_text(errors="replace").splitlines():
            fields = line.split("\t")
            if len(fields) != 7:
                continue  # a line cut short when the process ended
            moment = float(fields[0])
            if since <= moment <= until:
                yield moment, fields[1], fields[2], fields[3], fields[4], int(fields[5]), int(fields[6])


def key_names(keys) -> dict[str, str]:
    """``{hex of the key's DHT hash: key}`` for the keys callers logged."""
    from hivemind.dht.routing import DHTID

    return {DHTID.generate(source=key).to_bytes().hex(): key for key in keys if key}


def summarize(root: Path, since: float, until: float) -> dict[str, list[tuple]]:
    """Per peer (a directory under ``root``): rows ``(bytes_per_s, requests_per_s, direction, kind, what, key)``,
    the costliest first."""
    seconds = max(until - since, 1e-9)
    lines = {peer.name: list(read_lines(peer, since, until)) for peer in sorted(root.iterdir()) if peer.is_dir()}
    names = key_names({line[4] for peer_lines in lines.values() for line in peer_lines if line[1] == "call"})
    table = {}
    for peer, peer_lines in lines.items():
        groups = collections.defaultdict(lambda: [0, 0])
        for _, direction, kind, what, key, sent, received in peer_lines:
            if direction == "serve":
                key = names.get(key, f"hash {key[:8]}" if key else "")
            group = groups[(direction, kind, what, key)]
            group[0] += sent + received
            group[1] += 1
        table[peer] = sorted(((total / seconds, count / seconds, *group_key) for group_key, (total, count) in groups.items()),
                             reverse=True)
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path, help="the --request-log directory of a wan.py run")
    parser.add_argument("--since", type=float, default=0.0, help="start of the window (Unix time)")
    parser.add_argument("--until", type=float, default=float("inf"), help="end of the window (Unix time)")
    parser.add_argument("--top", type=int, default=15, help="rows per peer")
    options = parser.parse_args()
    if options.until == float("inf"):
        print("give --until (wan.py's measured_window): rates need the window's length", file=sys.stderr)
        return 2
    for peer, rows in summarize(options.directory, options.since, options.until).items():
        reads = [row for row in rows if row[2] == "read"]
        rows = [row for row in rows if row[2] != "read"]
        total = sum(row[0] for row in rows)
        print(f"\n{peer}: {total / 1000:.2f} KB/s in all")
        print(f"{'KB/s':>7} {'req/s':>6}  direction  kind         what / key")
        for rate, count, direction, kind, what, key in rows[:options.top]:
            print(f"{rate / 1000:7.2f} {count:6.2f}  {direction:9}  {kind:11}  {what} {key}")
        for _, count, _, _, how, key in sorted(reads, key=lambda row: -row[1]):
            print(f"{'':7} {count:6.2f}  read       {key}: {how}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
