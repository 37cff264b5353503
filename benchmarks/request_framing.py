"""What libp2p adds to each DHT request and to the averaging streams: the meter's ``other`` explained (issue 25).

Two real DHT peers on 127.0.0.1 (``tests/metered_peers.py``); one sends the
other ``--requests`` ``rpc_find`` requests for a key nobody stores (the
smallest answer), then as many ``rpc_store`` requests of a record the size of a
signed progress entry. For each, the bytes hivemind's messages carry (the
meter's count, the asker's side) against the TCP payload of the asker's p2pd
sockets (``ss``): the difference is what a request costs on top, paid at both
ends (each request opens a libp2p stream: protocol negotiation, yamux and
noise framing, the stream's close). A peer's ``other`` at the scale lab's 8
peers is mostly that, times its requests a second.

Then the averaging streams (rows since 2026-11-29): the asker streams
``--stream-mb`` of hivemind's averaging messages (``AveragingData`` with a
tensor part of 64 KiB, hivemind's streaming chunk, or 4 KiB) to the other, on 1
stream or 8 at once; what libp2p adds there is a share of the bytes averaged.

    .venv/bin/python benchmarks/request_framing.py --json benchmarks/request_framing_<date>.jsonl
    .venv/bin/python benchmarks/request_framing.py --report benchmarks/request_framing_<date>.jsonl
"""

from __future__ import annotations

import argparse
import functools
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

from metered_peers import installed_meter, loopback_dhts  # noqa: E402
from run_facts import append_row, facts, read_rows  # noqa: E402

RECORD_BYTES = 869  # a signed progress entry (scale_model's fitted size)
SINK = "request_framing.sink"
STREAMS = ((1, 2**16), (8, 2**16), (8, 2**12))  # concurrent streams, tensor part bytes a message


def tcp_payload(pid: int) -> int:
    """Bytes sent and received by the TCP sockets of process ``pid``, loopback ones too (``ss -tinp``)."""
    total, taken = 0, False
    for line in subprocess.run(["ss", "-tinpH"], capture_output=True, text=True, timeout=10).stdout.splitlines():
        if not line.startswith(("\t", " ")):
            taken = f"pid={pid}," in line
        elif taken:
            counts = dict(re.findall(r"\bbytes_(sent|received):(\d+)", line))
            total += int(counts.get("sent", 0)) + int(counts.get("received", 0))
            taken = False
    return total


async def _p2pd_pid(dht, node) -> int:
    return node.p2p._child.pid


async def _requests(dht, node, peer, kind: str, count: int) -> None:
    """Run in the asker's DHT process: ``count`` requests of ``kind`` to ``peer``, one after the other."""
    from hivemind.dht.routing import DHTID
    from hivemind.utils import get_dht_time

    key = DHTID.generate(source="request-framing")
    for index in range(count):
        if kind == "rpc_find":
            await node.protocol.call_find(peer, [key])
        else:
            await node.protocol.call_store(peer, keys=[key], values=[bytes(RECORD_BYTES)],
                                           expiration_time=[get_dht_time() + 60 + index], subkeys=[b"framing"])


async def _add_sink(dht, node) -> None:
    """Run in the receiving DHT process: a handler that reads an averaging stream to its end."""
    from hivemind.proto import averaging_pb2

    async def sink(stream, context):
        async for _ in stream:
            pass
        return averaging_pb2.AveragingData()

    await node.p2p.add_protobuf_handler(SINK, sink, averaging_pb2.AveragingData, stream_input=True)


async def _stream(dht, node, peer, streams: int, messages: int, part_bytes: int) -> None:
    """Run in the asker's DHT process: ``streams`` streams at once, each ``messages`` averaging messages."""
    import asyncio

    from hivemind.proto import averaging_pb2, runtime_pb2

    part = runtime_pb2.Tensor(buffer=bytes(part_bytes))

    async def parts():
        for _ in range(messages):
            yield averaging_pb2.AveragingData(tensor_part=part)

    await asyncio.gather(*(node.p2p.call_protobuf_handler(peer, SINK, parts(), averaging_pb2.AveragingData)
                           for _ in range(streams)))


def _streams(meter, asker, server, pid: int, megabytes: float) -> dict:
    """Per ``STREAMS`` case: the messages' and the TCP payload's bytes at the asker, and libp2p's share."""
    server.run_coroutine(_add_sink)
    found = {}
    for streams, part_bytes in STREAMS:
        messages = max(1, int(megabytes * 1e6 / part_bytes / streams))
        before_messages, before_payload = sum(map(sum, meter.totals().values())), tcp_payload(pid)
        asker.run_coroutine(functools.partial(_stream, peer=server.peer_id, streams=streams, messages=messages,
                                              part_bytes=part_bytes))
        time.sleep(1.0)
        sent = (sum(map(sum, meter.totals().values())) - before_messages) / 2  # both ends counted: half is the asker's
        payload = tcp_payload(pid) - before_payload
        found[f"{streams} x {part_bytes // 1024} KiB"] = {"messages_bytes": sent, "tcp_payload_bytes": payload,
                                                           "added_share": (payload - sent) / sent}
    return found


def measure(count: int, megabytes: float) -> dict:
    """The row: per request kind, the messages' and the TCP payload's bytes at the asker, per request."""
    meter = installed_meter()  # before the peers start: their DHT processes count into it
    kinds = {}
    with loopback_dhts(Path(tempfile.mkdtemp(prefix="p2ptrain-framing-")), 2) as (asker, server):
        pid = asker.run_coroutine(_p2pd_pid)
        for kind in ("rpc_find", "rpc_store"):
            asker.run_coroutine(functools.partial(_requests, peer=server.peer_id, kind=kind, count=5))  # connected
            time.sleep(0.5)
            messages, payload = sum(map(sum, meter.totals().values())), tcp_payload(pid)
            asker.run_coroutine(functools.partial(_requests, peer=server.peer_id, kind=kind, count=count))
            time.sleep(1.0)
            # the meter counts both ends of each request (both peers are this process's children): half is the asker's
            messages = (sum(map(sum, meter.totals().values())) - messages) / 2 / count
            payload = (tcp_payload(pid) - payload) / count
            kinds[kind] = {"messages_bytes": messages, "tcp_payload_bytes": payload, "added_bytes": payload - messages}
        streams = _streams(meter, asker, server, pid, megabytes)
    return {"requests": count, "kinds": kinds, "stream_mb": megabytes, "streams": streams}


def report(path: Path) -> str:
    """The table of a ``--json`` file's rows."""
    lines = ["| commit, date | request | messages, B a request (asker) | TCP payload, B a request (asker) | added by libp2p, B |",
             "|---|---|---:|---:|---:|"]
    for row in read_rows(path):
        for kind, found in row["kinds"].items():
            lines.append(f"| {row['commit'][:7]}, {row['date'][:10]} | {kind} ({row['requests']}) | "
                         f"{found['messages_bytes']:.0f} | {found['tcp_payload_bytes']:.0f} | {found['added_bytes']:.0f} |")
    streamed = [row for row in read_rows(path) if "streams" in row]
    if streamed:
        lines += ["", "| commit, date | averaging streams at once x tensor part | messages, MB (asker) | TCP payload, MB (asker) | added by libp2p |",
                  "|---|---|---:|---:|---:|"]
        for row in streamed:
            for case, found in row["streams"].items():
                lines.append(f"| {row['commit'][:7]}, {row['date'][:10]} | {case} | {found['messages_bytes'] / 1e6:.1f} | "
                             f"{found['tcp_payload_bytes'] / 1e6:.1f} | {100 * found['added_share']:.2f} % |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="requests of each kind measured")
    parser.add_argument("--stream-mb", type=float, default=50.0, help="megabytes of averaging messages streamed per case")
    parser.add_argument("--json", type=Path, help="append the row here")
    parser.add_argument("--report", type=Path, help="print the table of a --json file and exit")
    options = parser.parse_args()
    if options.report:
        print(report(options.report))
        return 0
    row = {**measure(options.requests, options.stream_mb), **facts()}
    append_row(options.json, row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
