"""A boundary fake of the p2ptrain daemon for the TUI's tests.

It speaks the real control protocol (``p2ptrain.protocol``: newline-delimited
JSON on a real Unix socket at ``resolve_paths(home).socket``) from an asyncio
server in a background thread, serves canned but plausible state with fixed
timestamps (so snapshots never change), applies the control verbs the way the
daemon's state machine does, and records every request it received.

Run as a program (``python fake_daemon.py daemon --home DIR``) it stands in
for the ``p2ptrain`` executable that the TUI's "start a user daemon" button
launches; it serves until SIGTERM.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import signal
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from p2ptrain.paths import resolve_paths  # noqa: E402
from p2ptrain.protocol import (  # noqa: E402
    BAD_REQUEST,
    INVALID_STATE,
    MAX_LINE_BYTES,
    PROTOCOL_VERSION,
    UNKNOWN_METHOD,
    encode,
    error_reply,
)

# The frozen "now" of every canned timestamp; tests give the app a clock that returns it.
FROZEN_NOW = 1_767_000_000.0
RUN_ID = "tiny-demo"
LOCAL_PEER_ID = "12D3KooWLocalPeer0000000000000000000000000000AmberFox"


def _gpu() -> dict:
    return {
        "index": 0,
        "name": "NVIDIA GeForce RTX 3060",
        "memory_total_mib": 12288,
        "memory_used_mib": 10650,
        "utilization_pct": 97,
        "temperature_c": 78,
        "power_w": 162.0,
        "power_limit_w": 170.0,
        "fan_pct": 64,
    }


def _local() -> dict:
    return {
        "peer_id": LOCAL_PEER_ID,
        "nickname": "amber-fox",
        "addresses": ["/ip4/127.0.0.1/tcp/40111/p2p/" + LOCAL_PEER_ID],
        "reachability": "direct",
        "device": "cuda:0",
        "precision": "bf16",
        "quantization": "none",
        "micro_batch": 8,
        "grad_accum": 4,
        "parameters": 23_400_000,
        "trainable_parameters": 23_400_000,
        "samples_per_second": 41.7,
        "loss": 2.871,
        "contributed_samples": 153_600,
    }


def training_status() -> dict:
    """The daemon mid-epoch in a three-peer run."""
    return {
        "protocol": PROTOCOL_VERSION,
        "version": "0.1.0",
        "state": "training",
        "pause_reason": None,
        "since": FROZEN_NOW - 2 * 3600 - 5 * 60,
        "started_at": FROZEN_NOW - 26 * 3600,
        "run": {
            "id": RUN_ID,
            "mode": "sync",
            "model": "tiny",
            "epoch": 42,
            "samples_accumulated": 2816,
            "target_batch_size": 4096,
            "eta_next_epoch_s": 31.0,
            "num_peers": 3,
        },
        "local": _local(),
        "hardware": {"gpus": [_gpu()], "cpu": {"name": "AMD Ryzen 5 5600X", "cores": 12}, "ram": {"total_mib": 32000}},
        "health": [],
    }


def paused_status(reason: str = "battery", paused_until: float | None = None) -> dict:
    """The daemon paused for ``reason``; ``paused_until`` makes it a timed pause."""
    status = training_status()
    status.update(state="paused", pause_reason=reason, since=FROZEN_NOW - 12 * 60)
    status["local"]["samples_per_second"] = 0.0
    status["hardware"]["gpus"][0].update(utilization_pct=0, memory_used_mib=410, temperature_c=41, power_w=14.0)
    if paused_until is not None:
        status["paused_until"] = paused_until
    return status


def idle_status() -> dict:
    """The daemon in no run: run and local are null, hardware still known."""
    status = training_status()
    status.update(state="idle", pause_reason=None, since=FROZEN_NOW - 300, run=None, local=None)
    status["hardware"]["gpus"][0].update(utilization_pct=0, memory_used_mib=410, temperature_c=38, power_w=12.0)
    return status


def error_status() -> dict:
    """The daemon in the error state, with a fix."""
    status = idle_status()
    status.update(state="error", since=FROZEN_NOW - 60)
    status["health"] = [
        {
            "level": "error",
            "message": "the training worker ran out of GPU memory 3 times",
            "fix": "close other GPU programs, then press j to join again",
        }
    ]
    return status


def sample_peers() -> list[dict]:
    """Three peers: this machine, a relayed laptop, and one with another manifest."""

    def row(peer_id, nickname, device, precision, quantization, micro_batch, speed, epoch, loss, link, seen, **extra):
        return {
            "peer_id": peer_id,
            "nickname": nickname,
            "device": device,
            "precision": precision,
            "quantization": quantization,
            "micro_batch": micro_batch,
            "samples_per_second": speed,
            "loss": loss,
            "epoch": epoch,
            "contributed_samples": int(speed * 3600),
            "manifest_hash": "9f2c1e",
            "compatible": True,
            "reachability": link,
            "version": "0.1.0",
            "last_seen": FROZEN_NOW - seen,
            "is_local": False,
            **extra,
        }

    return [
        row(LOCAL_PEER_ID, "amber-fox", "cuda:0", "bf16", "none", 8, 41.7, 42, 2.871, "direct", 0, is_local=True),
        row("12D3KooWLaptop000000000000000000000000000000000QuietOwl", "quiet-owl", "cpu", "fp32", "none", 2, 3.2,
            42, 2.902, "relayed", 4),
        row("12D3KooWOther0000000000000000000000000000000000RedCrane", "red-crane", "cuda:0", "fp16", "nf4", 16,
            88.0, 17, 3.410, "direct", 9, manifest_hash="77aa01", compatible=False),
    ]


def sample_steps() -> list[dict]:
    """A loss curve falling from 5.5 to about 2.9 over the last five hours, one row a minute."""
    rows = []
    for minute in range(300):
        ts = FROZEN_NOW - (300 - minute) * 60
        loss = 2.85 + 2.65 * (0.985**minute) + 0.04 * ((minute * 7) % 5 - 2) / 2
        rows.append({"ts": ts, "run_id": RUN_ID, "epoch": minute // 7, "loss": round(loss, 4), "samples": 256,
                     "samples_per_second": 41.0})
    return rows


def sample_epochs() -> list[dict]:
    """Epochs 30-41 of the run, about seven minutes each."""
    rows = []
    ended = FROZEN_NOW - 5 * 60
    for epoch in range(41, 29, -1):
        duration = 380 + (epoch % 4) * 25
        loss = 2.85 + 2.65 * (0.985 ** (epoch * 7))
        rows.append({"run_id": RUN_ID, "epoch": epoch, "started_at": ended - duration, "ended_at": ended,
                     "duration_s": float(duration), "num_peers": 3, "global_samples": 4096,
                     "loss": round(loss, 4), "val_loss": round(loss + 0.12, 4)})
        ended -= duration
    return rows[::-1]


def sample_events() -> list[dict]:
    """What happened lately, oldest first."""
    events = [
        (-26 * 3600, "started", "daemon started (p2ptrain 0.1.0)"),
        (-26 * 3600 + 5, "joined", f"joined {RUN_ID} as amber-fox with 2 peers"),
        (-3 * 3600, "paused", "paused: running on battery"),
        (-2 * 3600 - 5 * 60, "resumed", "resumed: back on mains power"),
        (-5 * 60, "epoch", "epoch 41 done in 6m 45s with 3 peers, loss 2.874"),
        (-60, "peer", "red-crane has another manifest (77aa01): not averaging with it"),
    ]
    return [{"ts": FROZEN_NOW + offset, "kind": kind, "message": message, "data": {}} for offset, kind, message in
            events]


class FakeDaemon:
    """The control protocol on a real Unix socket, served from a thread.

    Args:
        home: the ``--home`` directory; the socket goes where the daemon's would.
        status: the initial status (defaults to :func:`training_status`).
    """

    def __init__(self, home: str | os.PathLike, status: dict | None = None) -> None:
        self.paths = resolve_paths(home)
        self.socket_path = self.paths.socket
        self.status = status if status is not None else training_status()
        self.peers = sample_peers()
        self.steps = sample_steps()
        self.epochs = sample_epochs()
        self.events = sample_events()
        self.requests: list[dict] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._thread: threading.Thread | None = None
        self._changed: asyncio.Event | None = None

    def start(self) -> "FakeDaemon":
        """Listen on the socket; returns once connections are accepted."""
        self.paths.create()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), daemon=True, name="fake-daemon")
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the fake daemon did not start listening within 10 s")
        return self

    def stop(self) -> None:
        """Close the socket and every connection (as a daemon that exits does), then end the server thread."""
        if self._loop is not None and self._thread is not None:
            asyncio.run_coroutine_threadsafe(self._close_connections(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self.socket_path.unlink(missing_ok=True)
        # A long --home puts the socket in a short directory under /tmp: leave nothing behind there.
        if self.paths.runtime_dir.parent != self.paths.home:
            for leftover in self.paths.runtime_dir.glob("*"):
                leftover.unlink()
            self.paths.runtime_dir.rmdir()

    def __enter__(self) -> "FakeDaemon":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def set_status(self, status: dict) -> None:
        """Serve ``status`` from now on (and push it to subscribers)."""
        with self._lock:
            self.status = status
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._notify_change)

    def methods_called(self) -> list[str]:
        """The method of every request so far, in order."""
        with self._lock:
            return [request.get("method") for request in self.requests]

    def requests_for(self, method: str) -> list[dict]:
        with self._lock:
            return [request for request in self.requests if request.get("method") == method]

    async def _close_connections(self) -> None:
        self._server.close()
        handlers = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)

    def _notify_change(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _serve(self, ready: threading.Event) -> None:
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        self._changed = asyncio.Event()
        self._server = self._loop.run_until_complete(
            asyncio.start_unix_server(self._handle, path=str(self.socket_path), limit=MAX_LINE_BYTES)
        )
        os.chmod(self.socket_path, 0o600)
        ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                try:
                    request = json.loads(line)
                except ValueError:
                    writer.write(encode(error_reply(None, BAD_REQUEST, "not JSON", "send one JSON object a line")))
                    continue
                with self._lock:
                    self.requests.append(request)
                if request.get("method") == "subscribe":
                    await self._stream(writer)
                    return
                writer.write(encode(self._reply(request)))
                await writer.drain()
        # stop() cancels the handlers: they end quietly (asyncio would log a cancelled one), closing the connection.
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _stream(self, writer: asyncio.StreamWriter) -> None:
        # Take the event before the first await: a change made once the request is recorded is never missed.
        changed = self._changed
        writer.write(encode({"event": "snapshot", "data": self.status}))
        await writer.drain()
        while True:
            await changed.wait()
            changed = self._changed
            writer.write(encode({"event": "status", "data": self.status}))
            await writer.drain()

    def _reply(self, request: dict) -> dict:
        request_id = request.get("id")
        method = request.get("method")
        params = request.get("params") or {}
        handler = getattr(self, "_method_" + str(method).replace(".", "_"), None)
        if handler is None:
            return error_reply(request_id, UNKNOWN_METHOD, f"unknown method {method!r}", "see p2ptrain --help")
        with self._lock:
            result = handler(params)
        if isinstance(result, tuple):
            return error_reply(request_id, *result)
        return {"id": request_id, "result": copy.deepcopy(result)}

    # The methods, as in DEVELOPERS.md's table. An error is a (code, message, fix) tuple.

    def _method_status(self, params: dict) -> dict:
        return self.status

    def _method_peers(self, params: dict) -> dict:
        run = self.status.get("run") or {}
        return {"run_id": run.get("id"), "peers": self.peers if run else []}

    def _method_metrics(self, params: dict) -> dict:
        since = params.get("since") or 0
        rows = [row for row in self.steps if row["ts"] > since]
        return {"steps": rows[-int(params.get("limit") or 1000):]}

    def _method_epochs(self, params: dict) -> dict:
        return {"epochs": self.epochs[-int(params.get("limit") or 100):]}

    def _method_events(self, params: dict) -> dict:
        since = params.get("since") or 0
        rows = [row for row in self.events if row["ts"] > since]
        return {"events": rows[-int(params.get("limit") or 100):]}

    def _method_join(self, params: dict) -> dict | tuple:
        if not isinstance(params.get("run"), str):
            return BAD_REQUEST, "join needs a run name", "pass run, e.g. tiny-demo"
        if self.status["state"] not in ("idle", "error"):
            return INVALID_STATE, f"already in run {self.status['run']['id']}", "leave it first: p2ptrain leave"
        self.status = training_status()
        self.status["run"]["id"] = params["run"]
        self.status.update(state="joining", since=FROZEN_NOW)
        return self.status

    def _method_pause(self, params: dict) -> dict | tuple:
        if self.status["state"] not in ("training", "finishing", "joining"):
            return INVALID_STATE, f"cannot pause while {self.status['state']}", "join a run first: p2ptrain join RUN"
        self.status = paused_status(params.get("reason", "user"))
        if params.get("for_s"):
            self.status["paused_until"] = FROZEN_NOW + float(params["for_s"])
        return self.status

    def _method_resume(self, params: dict) -> dict | tuple:
        if self.status["state"] != "paused":
            return INVALID_STATE, f"cannot resume while {self.status['state']}", "pause first"
        self.status = training_status()
        return self.status

    def _method_finish(self, params: dict) -> dict | tuple:
        if self.status["state"] != "training":
            return INVALID_STATE, f"cannot finish while {self.status['state']}", "finish works while training"
        self.status["state"] = "finishing"
        return self.status

    def _method_leave(self, params: dict) -> dict | tuple:
        if self.status.get("run") is None:
            return INVALID_STATE, "not in a run", "join one first: p2ptrain join RUN"
        self.status = idle_status()
        return self.status

    def _method_config_get(self, params: dict) -> dict:
        return {"config": {"nickname": "amber-fox"}, "path": str(self.paths.config_file)}


def main(argv: list[str]) -> int:
    """``fake_daemon.py daemon --home DIR``: serve the training state until SIGTERM."""
    if len(argv) != 3 or argv[0] != "daemon" or argv[1] != "--home":
        print("usage: fake_daemon.py daemon --home DIR", file=sys.stderr)
        return 2
    daemon = FakeDaemon(argv[2]).start()
    daemon.paths.daemon_pid_file.write_text(f"{os.getpid()}\n")
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    while not stopped.wait(0.2):
        pass
    daemon.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
