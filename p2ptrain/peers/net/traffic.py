"""What this peer sends and receives, by kind, measured where the bytes pass.

Two measurements, both in the training worker:

- **By kind**, at hivemind's message layer: every protobuf message that one of
  the worker's processes (the worker, the DHT process, the averagers) sends to
  or receives from another peer is counted, in shared memory, under a kind:
  ``averaging`` (tensor parts of all-reduce rounds and state downloads),
  ``matchmaking`` (forming averaging groups: join requests and the DHT records
  that announce groups and state sharing), ``progress`` (hivemind's progress
  records), ``metrics`` (our per-peer metrics records), ``dht`` (every other
  DHT request: routing upkeep, the manifest, and serving other peers' lookups
  and stores). A DHT request takes the kind of the key it was made for
  (``kind_of_key``): the DHT process marks each ``dht.get``/``dht.store`` it
  runs, and the requests it sends for it inherit the mark.
- **In total**, at the kernel: the TCP bytes of p2pd's sockets (``ss``, to each
  socket's last byte: ``SocketTotals``), which
  add what the message layer does not see (libp2p's own protocols, encryption,
  framing, relayed traffic for others): ``other`` is that total minus the kinds.

``TrafficMeter.install()`` must run in the worker before the DHT starts: the
processes hivemind forks afterwards inherit the counters and the hooks.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import multiprocessing
import os
import re
import shutil
import subprocess
import threading
import time

from p2ptrain.peers.net import request_log
from p2ptrain.processes import dying_with_parent
from p2ptrain.worker_pipe import Traffic

logger = logging.getLogger(__name__)

KINDS = ("averaging", "matchmaking", "progress", "metrics", "dht", "other")
_FRAMING_BYTES = 9  # hivemind's marker byte and 8-byte length before each streamed message
_current_kind: contextvars.ContextVar[str] = contextvars.ContextVar("p2ptrain_traffic_kind", default="dht")
_current_key: contextvars.ContextVar[str] = contextvars.ContextVar("p2ptrain_traffic_key", default="")
_meter: TrafficMeter | None = None


def kind_of_key(key) -> str:
    """The kind of traffic a DHT request for ``key`` is (see the module docstring)."""
    if not isinstance(key, str):
        return "dht"
    if key.endswith("_progress"):
        return "progress"
    if key.endswith("_metrics"):
        return "metrics"
    if "_averager." in key or "_diloco." in key or key.endswith(".all_averagers"):
        return "matchmaking"
    return "dht"


@contextlib.contextmanager
def counted_as_key(key):
    """Count the DHT requests made inside this block (in this task) under the kind of ``key``."""
    token, key_token = _current_kind.set(kind_of_key(key)), _current_key.set(str(key))
    try:
        yield
    finally:
        _current_kind.reset(token)
        _current_key.reset(key_token)


def kind_of_message(message_type) -> str:
    """The kind of a streamed hivemind message, by its protobuf type."""
    name = getattr(message_type, "__name__", type(message_type).__name__)
    if name in ("AveragingData", "DownloadData", "DownloadRequest"):
        return "averaging"
    if name in ("JoinRequest", "MessageFromLeader"):
        return "matchmaking"
    return "other"


class TrafficMeter:
    """Counters of bytes sent and received by kind, shared by the worker and the processes it forks."""

    def __init__(self):
        self._counts = multiprocessing.Array("d", 2 * len(KINDS))  # sent, received per kind

    def add(self, kind: str, sent: int = 0, received: int = 0) -> None:
        index = 2 * KINDS.index(kind)
        with self._counts.get_lock():
            self._counts[index] += sent
            self._counts[index + 1] += received

    def totals(self) -> dict[str, tuple[float, float]]:
        """Bytes ``(sent, received)`` per kind since the meter was made."""
        with self._counts.get_lock():
            values = list(self._counts)
        return {kind: (values[2 * i], values[2 * i + 1]) for i, kind in enumerate(KINDS)}

    def install(self) -> None:
        """Count every hivemind message of this process and the processes forked from it from now on."""
        global _meter
        _meter = self
        _install_hooks()


def _count(kind: str, sent: int = 0, received: int = 0) -> None:
    if _meter is not None:
        _meter.add(kind, sent, received)


def _install_hooks() -> None:
    """Wrap hivemind's P2P message functions and the DHT's get/store once per process tree."""
    from hivemind.dht import DHT
    from hivemind.p2p import P2P

    if getattr(P2P, "p2ptrain_counted", False):
        return
    P2P.p2ptrain_counted = True
    send_protobuf, receive_protobuf = P2P.send_protobuf, P2P.receive_protobuf
    call_unary, add_unary = P2P._call_unary_protobuf_handler, P2P._add_protobuf_unary_handler

    async def counted_send(protobuf, writer):
        await send_protobuf(protobuf, writer)
        kind, size = kind_of_message(type(protobuf)), protobuf.ByteSize() + _FRAMING_BYTES
        _count(kind, sent=size)
        if request_log.enabled():  # looked at each time: a test sets it for the peers it forks
            request_log.record("stream", kind, type(protobuf).__name__, "", size, 0)

    async def counted_receive(input_protobuf_type, reader):
        protobuf, error = await receive_protobuf(input_protobuf_type, reader)
        received = protobuf if protobuf is not None else error
        kind, size = kind_of_message(input_protobuf_type), received.ByteSize() + _FRAMING_BYTES
        _count(kind, received=size)
        if request_log.enabled():
            request_log.record("stream", kind, type(received).__name__, "", 0, size)
        return protobuf, error

    async def counted_call(self, peer_id, handle_name, input, output_protobuf_type):
        response = await call_unary(self, peer_id, handle_name, input, output_protobuf_type)
        _count(_current_kind.get(), sent=input.ByteSize(), received=response.ByteSize())
        if request_log.enabled():
            request_log.record("call", _current_kind.get(), handle_name, _current_key.get(), input.ByteSize(),
                               response.ByteSize())
        return response

    async def counted_handler(self, handle_name, handler, input_protobuf_type, balanced=False):
        async def counted(request, context):
            response = await handler(request, context)
            # answering other peers' DHT requests: upkeep of the swarm's DHT
            _count("dht", sent=response.ByteSize(), received=request.ByteSize())
            if request_log.enabled():
                request_log.record("serve", "dht", handle_name, request_log.served_key(request), response.ByteSize(),
                                   request.ByteSize())
            return response

        await add_unary(self, handle_name, counted, input_protobuf_type, balanced=balanced)

    P2P.send_protobuf, P2P.receive_protobuf = staticmethod(counted_send), staticmethod(counted_receive)
    P2P._call_unary_protobuf_handler, P2P._add_protobuf_unary_handler = counted_call, counted_handler

    for name in ("_get", "_store"):
        original = getattr(DHT, name)

        async def marked(self, key, *args, __original=original, **kwargs):
            with counted_as_key(key):
                return await __original(self, key, *args, **kwargs)

        setattr(DHT, name, marked)


_SOCKET_LINE = re.compile(r"^[A-Z-]+\s+\d+\s+\d+\s+(\S+)\s+(\S+)\s")  # state, recv-q, send-q, local, peer
_BYTES = re.compile(r"\bbytes_(sent|received):(\d+)")
_INODE = re.compile(r"\bino:(\d+)")
_COOKIE = re.compile(r"\bsk:([0-9a-f]+)")
_LEAVING = "not dst 127.0.0.0/8 and not dst [::1]"  # ss's filter: sockets whose bytes leave the machine
_VANISHED_KEPT_S = 60.0  # how long a socket gone from the listing waits for the kernel's last word on it


def _loopback(address: str) -> bool:
    return address.startswith(("127.", "[::1]", "[::ffff:127."))


def _socket_inodes(pid: int) -> set[str] | None:
    """The inodes of process ``pid``'s sockets (its ``/proc/PID/fd`` links ``socket:[N]``), or None when unreadable."""
    inodes = set()
    try:
        descriptors = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    for descriptor in descriptors:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{descriptor}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _parse_sockets(lines, inodes: set[str] | None = None):
    """``(cookie, local, peer, (bytes sent, bytes received))`` for each TCP socket in ``ss -tie`` output
    ``lines`` that leaves the machine (loopback ones never reach the network), only those whose inode
    is in ``inodes`` unless it is None. The cookie (``sk:``) names a socket for its whole life, even
    after its process let go of it, when its inode reads 0."""
    key = None
    for line in lines:
        if not line.startswith(("\t", " ")):
            match, inode, cookie = _SOCKET_LINE.match(line), _INODE.search(line), _COOKIE.search(line)
            key = None
            if match and inode and cookie and not _loopback(match.group(2)) and (inodes is None or inode.group(1) in inodes):
                key = (cookie.group(1), match.group(1), match.group(2))
        elif key is not None:
            counts = dict(_BYTES.findall(line))
            yield (*key, (int(counts.get("sent", 0)), int(counts.get("received", 0))))
            key = None


def socket_bytes(pid: int) -> dict[str, tuple[int, int]] | None:
    """``{cookie: (bytes sent, bytes received)}`` of the TCP sockets of process ``pid`` that leave the
    machine; None when ``ss`` is missing or fails.

    The sockets are found by their inodes (``ss -e``) rather than by ``ss -p``, which reads every
    process's descriptors: this runs every few seconds. They are told apart by their cookies, not
    their addresses: libp2p dials from its listening port, so a peer that leaves and joins again
    through the same NAT mapping comes back on the same two addresses, with counters from zero."""
    inodes = _socket_inodes(pid)
    if inodes is None:
        return None
    try:
        finished = subprocess.run(["ss", "-tineH", _LEAVING], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if finished.returncode != 0:
        return None
    return {cookie: counts for cookie, _, _, counts in _parse_sockets(finished.stdout.splitlines(), inodes)}


class SocketTotals:
    """Bytes through a process's TCP sockets since this was made.

    Read every few seconds (``sample``): a socket's counters are listed while it lives. What it
    carries between its last reading and its end (a peer that leaves takes its last round with
    it) comes from the kernel's word on each socket as it is destroyed (``ss -tieE``, read on a
    thread while this lives; ``close()`` ends it). Without that (an old ``ss``), those last bytes
    are lost; a connection that opens and closes between two readings is never seen either way.

    Args:
        pid: the process whose sockets are counted (p2pd's; ``/proc/PID/fd`` must be readable).
    """

    def __init__(self, pid: int):
        self.pid = pid
        self._lock = threading.Lock()
        self._last: dict[str, tuple[int, int]] = {}  # cookie: counters at its last reading
        self._vanished: dict[str, float] = {}  # cookie: when it left the listing, awaiting its last word
        self._finished: set[str] = set()  # counted to their end; a listing taken before then still shows them
        self.sent = self.received = 0
        self._ends = self._watch_ends()
        self.sample()
        self.sent = self.received = 0  # count from now on, not what the sockets carried before

    def _watch_ends(self) -> subprocess.Popen | None:
        """Start ``ss`` reporting each socket the kernel destroys, line by line, read by a thread."""
        command = ["ss", "-tineEH", _LEAVING]  # every socket of the namespace: on a test machine, mostly loopback
        if shutil.which("stdbuf"):  # else ss writes its events a buffer at a time
            command = ["stdbuf", "-oL", *command]
        try:
            process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                       preexec_fn=dying_with_parent())
        except OSError:
            return None
        threading.Thread(target=self._read_ends, args=(process.stdout,), name="socket-ends", daemon=True).start()
        return process

    def _read_ends(self, stream) -> None:
        lines = iter(stream.readline, "")
        for cookie, _, _, (sent, received) in _parse_sockets(lines):
            with self._lock:
                if cookie in self._last:
                    self._count(cookie, sent, received)
                    del self._last[cookie]
                    self._vanished.pop(cookie, None)
                    self._finished.add(cookie)

    def _count(self, cookie: str, sent: int, received: int) -> None:
        before_sent, before_received = self._last.get(cookie, (0, 0))
        self.sent += max(0, sent - before_sent)
        self.received += max(0, received - before_received)

    def sample(self) -> tuple[int, int]:
        """Take a sample; returns the running totals ``(sent, received)``."""
        now = socket_bytes(self.pid)
        moment = time.monotonic()
        with self._lock:
            if now is None:  # ss failed this time: the next reading counts what passed meanwhile
                return self.sent, self.received
            for cookie, (sent, received) in now.items():
                if cookie not in self._finished:
                    self._count(cookie, sent, received)
                    self._last[cookie] = (sent, received)
                    self._vanished.pop(cookie, None)
            self._finished.intersection_update(now)
            watched = self._ends is not None and self._ends.poll() is None
            for cookie in set(self._last) - set(now):
                self._vanished.setdefault(cookie, moment)
                if not watched or moment - self._vanished[cookie] > _VANISHED_KEPT_S:
                    del self._last[cookie]
                    del self._vanished[cookie]
            return self.sent, self.received

    def close(self) -> None:
        """Stop watching sockets end."""
        if self._ends is not None and self._ends.poll() is None:
            self._ends.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._ends.wait(5)
        if self._ends is not None:
            self._ends.stdout.close()


async def _p2pd_pid(dht, node) -> int | None:
    """Run in the DHT process: the pid of its p2pd."""
    child = getattr(node.p2p, "_child", None)
    return child.pid if child is not None else None


class TrafficReporter:
    """Reports this peer's traffic every ``interval_s``: rates over the last ``window_s`` and totals.

    Args:
        meter: the installed ``TrafficMeter``.
        dht: the worker's DHT (its p2pd's sockets give the total).
        report: sends a ``worker_pipe.Traffic`` to the daemon (its fields are ``sample()``'s).
        sockets_every_s: how often p2pd's sockets are read between reports: a connection that
            opens and closes between two readings is never counted (``SocketTotals``); each
            reading costs a few milliseconds of CPU (``socket_bytes``).
    """

    def __init__(self, meter: TrafficMeter, dht, report, interval_s: float = 15.0, window_s: float = 60.0,
                 sockets_every_s: float = 2.0):
        self.meter, self.report, self.dht = meter, report, dht
        self.interval_s, self.window_s, self.sockets_every_s = interval_s, window_s, sockets_every_s
        self._stopping = threading.Event()
        self.sockets: SocketTotals | None = None
        self._samples: list[tuple[float, dict, tuple[int, int]]] = []
        self.since = time.time()
        self._thread = threading.Thread(target=self._run, name="traffic", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def sample(self) -> dict:
        """Take a sample and return the report's fields: ``bytes_per_s`` by kind (sent + received) over the
        last ``window_s``, ``totals`` by kind since ``since`` (when this reporter began counting) as of
        ``totals_at`` (Unix time),
        ``sent_bytes_per_s``, ``received_bytes_per_s``, ``sent_bytes`` and ``received_bytes`` since
        ``since``, ``measured_at`` (``kernel`` when p2pd's sockets were read, ``messages`` when only
        hivemind's messages were).

        ``other`` is the kernel's total less the kinds. A message is counted when hivemind hands it
        to p2pd (or gets it from p2pd), the kernel's bytes when they cross TCP, so during a round
        megabytes can be counted on one side and not yet on the other: ``totals["other"]`` keeps
        the difference as it is (it can dip below zero for a moment, and over minutes the dips
        cancel), while a window's rate in ``bytes_per_s`` is never below zero. The kinds are read
        before and after the kernel's sockets and the mean taken, so that reading ``ss`` (slow
        under load) adds no skew of its own."""
        moment, wall, before = time.monotonic(), time.time(), self.meter.totals()
        total = self.sockets.sample() if self.sockets is not None else None
        after = self.meter.totals()
        kinds = {kind: ((before[kind][0] + after[kind][0]) / 2, (before[kind][1] + after[kind][1]) / 2) for kind in KINDS}
        if total is None:
            total = (sum(sent for sent, _ in kinds.values()), sum(received for _, received in kinds.values()))
        totals = {kind: sum(kinds[kind]) for kind in KINDS}
        if self.sockets is not None:
            totals["other"] += sum(total) - sum(totals.values())
        self._samples.append((moment, totals, total))
        while len(self._samples) > 2 and moment - self._samples[1][0] >= self.window_s:
            self._samples.pop(0)
        first_moment, first_totals, first_total = self._samples[0]
        seconds = moment - first_moment
        by_kind = {kind: max(0.0, (totals[kind] - first_totals[kind]) / seconds) if seconds > 0 else 0.0 for kind in KINDS}
        sent_rate = (total[0] - first_total[0]) / seconds if seconds > 0 else 0.0
        received_rate = (total[1] - first_total[1]) / seconds if seconds > 0 else 0.0
        return {"bytes_per_s": by_kind, "totals": totals, "totals_at": wall, "sent_bytes_per_s": sent_rate, "received_bytes_per_s": received_rate,
                "sent_bytes": total[0], "received_bytes": total[1], "since": self.since,
                "measured_at": "kernel" if self.sockets is not None else "messages"}

    def _find_p2pd(self) -> None:
        """Count p2pd's sockets from now on, if ``ss`` shows them (asked on this thread: with the averagers
        running, the DHT process can take long to answer)."""
        try:
            pid = self.dht.run_coroutine(_p2pd_pid)
        except Exception:
            pid = None
        if pid and socket_bytes(pid) is not None:
            self.sockets = SocketTotals(pid)

    def _run(self) -> None:
        self._find_p2pd()
        self.sample()
        next_report = time.monotonic() + self.interval_s
        while not self._stopping.wait(min(self.sockets_every_s, max(0.0, next_report - time.monotonic()))):
            try:
                if time.monotonic() >= next_report:
                    next_report += self.interval_s
                    self.report(Traffic(**self.sample()))
                elif self.sockets is not None:
                    self.sockets.sample()
            except Exception:
                logger.exception("Could not measure traffic")
        if self.sockets is not None:
            self.sockets.close()

    def shutdown(self) -> None:
        self._stopping.set()
