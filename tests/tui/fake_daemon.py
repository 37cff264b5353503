"""A boundary fake of the p2ptrain daemon for the TUI's tests.

It speaks the real control protocol (``p2ptrain.protocol``: newline-delimited
JSON on a real Unix socket at ``resolve_paths(home).socket``) from an asyncio
server in a background thread, serves the canned state of ``fake_data`` (fixed
timestamps, so snapshots never change) through the protocol's records
(``p2ptrain.control_types``: what the fake serves is read back with the codec
the daemon's clients use, so canned data the schema refuses fails the test
that serves it), applies the control verbs with the
real daemon's rules and error messages, pushes every change to subscribers as
the real daemon does, and records every request it received.
``test_tui_fake_contract.py`` drives it and a real daemon through the same
requests and compares the answers.

What the real daemon's training worker does by itself, a test does here:
``worker_joined`` (the worker joined its swarm) and ``push`` (a step, epoch,
event or peers update).

Run as a program (``python fake_daemon.py daemon --home DIR``) it stands in
for the ``p2ptrain`` executable that the TUI's "start a user daemon" button
launches; it serves until SIGTERM.
"""

from __future__ import annotations

import asyncio
import copy
import json
import math
import os
import signal
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).parent))

from fake_data import (  # noqa: E402
    FROZEN_NOW,
    idle_status,
    joining_status,
    paused_status,
    sample_epochs,
    sample_events,
    sample_peers,
    sample_steps,
    training_status,
)

from p2ptrain.control_types import EventsResult, JoinResult, PeersResult, Push, Record, Status, decode_push, plain  # noqa: E402
from p2ptrain.paths import resolve_paths  # noqa: E402
from p2ptrain.protocol import (  # noqa: E402
    BAD_REQUEST,
    INVALID_STATE,
    MAX_LINE_BYTES,
    METHODS,
    PROTOCOL_VERSION,
    UNKNOWN_METHOD,
    encode,
    error_reply,
)

IN_RUN = ("joining", "training", "paused", "finishing")
# How long the fake's worker takes to checkpoint and leave after ``leave`` (the real one: seconds).
LEAVE_S = 0.2


class RequestError(Exception):
    """A refused request: the error code, message and fix the reply carries."""

    def __init__(self, code: str, message: str, fix: str) -> None:
        super().__init__(message)
        self.code, self.message, self.fix = code, message, fix


def _bad(message: str, fix: str) -> RequestError:
    return RequestError(BAD_REQUEST, message, fix)


def _typed(record: type[Record], data: dict) -> dict:
    """``data`` as the real daemon sends it: read as ``record`` (checked), written back with every field."""
    return record.from_dict(data, f"the fake daemon's {record.__name__}").to_dict()


def _number(params: dict, name: str, minimum: float) -> float | None:
    """An optional number param, checked as the real daemon checks it (``daemon/methods.py``)."""
    value = params.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _bad(f"{name} must be a number, not {value!r}", f'send e.g. {{"{name}": 10}}')
    if value < minimum:
        raise _bad(f"{name} must be at least {minimum}, not {value!r}", f"send a {name} >= {minimum}")
    return value


class FakeDaemon:
    """The control protocol on a real Unix socket, served from a thread.

    Args:
        home: the ``--home`` directory; the socket goes where the daemon's would.
        status: the initial status (defaults to ``fake_data.training_status``).
        steps: the ``steps`` history (defaults to ``fake_data.sample_steps``: one worker's).
    """

    def __init__(self, home: str | os.PathLike, status: dict | None = None, steps: list[dict] | None = None) -> None:
        self.paths = resolve_paths(home)
        self.socket_path = self.paths.socket
        self.status = _typed(Status, status if status is not None else training_status())
        self.peers = sample_peers()
        self.steps = steps if steps is not None else sample_steps()
        self.epochs = sample_epochs()
        self.events = sample_events()
        self.requests: list[dict] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._thread: threading.Thread | None = None
        self._subscribers: set[asyncio.Queue] = set()
        self._methods = {
            "status": self._status,
            "peers": self._peers,
            "metrics": self._metrics,
            "epochs": self._epochs,
            "events": self._events,
            "join": self._join,
            "pause": self._pause,
            "resume": self._resume,
            "finish": self._finish,
            "leave": self._leave,
            "config.get": self._config_get,
        }

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

    # ----- what a test does in the daemon's place ----------------------------------------

    def set_status(self, status: dict) -> None:
        """Serve ``status`` from now on, and push it to subscribers (a policy pause, say)."""
        with self._lock:
            self._set_status(status)

    def worker_joined(self) -> None:
        """The training worker joined its swarm: ``joining`` becomes ``training`` (paused stays paused)."""
        with self._lock:
            run_id = self.status["run"]["id"]
            joined = training_status() if self.status["state"] != "paused" else paused_status("user")
            joined["run"]["id"] = run_id
            joined.update(since=self.status["since"], paused_until=self.status.get("paused_until"))
            self._set_status(joined)

    def push(self, event: str, data: dict) -> None:
        """Push ``{"event", "data"}`` to every subscriber and keep it in the history it belongs to."""
        with self._lock:
            history = {Push.STEP: self.steps, Push.EPOCH: self.epochs, Push.EVENT: self.events}.get(event)
            if history is not None:
                history.append(data)
            if event == Push.PEERS:
                self.peers = data["peers"]
            self._publish(event, data)

    def push_unchecked(self, event: str, data) -> None:
        """Push ``data`` as it is, whatever it is: what a broken daemon, or one of another version, would send."""
        with self._lock:
            self._loop.call_soon_threadsafe(self._deliver, encode({"event": event, "data": data}))

    def methods_called(self) -> list[str]:
        """The method of every request so far, in order."""
        with self._lock:
            return [request.get("method") for request in self.requests]

    def requests_for(self, method: str) -> list[dict]:
        with self._lock:
            return [request for request in self.requests if request.get("method") == method]

    # ----- the server --------------------------------------------------------------------

    def _set_status(self, status: dict) -> None:
        self.status = _typed(Status, status)
        self._publish(Push.STATUS, self.status)

    def _publish(self, event: str, data) -> None:
        data = plain(decode_push(event, data))  # checked as the TUI's feed reads it
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._deliver, encode({"event": event, "data": data}))

    def _deliver(self, line: bytes) -> None:
        for queue in self._subscribers:
            queue.put_nowait(line)

    def _record_event(self, kind: str, message: str, data: dict | None = None) -> None:
        """An event as the real daemon records and pushes one, just after the newest so far."""
        ts = max(event["ts"] for event in self.events) + 1 if self.events else FROZEN_NOW
        event = {"ts": ts, "kind": kind, "message": message, "data": data, "count": 1, "last_ts": ts}
        self.events.append(event)
        self._publish(Push.EVENT, event)

    async def _close_connections(self) -> None:
        self._server.close()
        handlers = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)

    def _serve(self, ready: threading.Event) -> None:
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
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
                except ValueError as error:
                    writer.write(encode(error_reply(None, BAD_REQUEST, f"not a JSON line: {error}",
                                                    'send e.g. {"id": 1, "method": "status", "params": {}}')))
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
        queue: asyncio.Queue = asyncio.Queue()
        with self._lock:
            # The snapshot and the queue in one step: no change falls between them.
            snapshot = encode({"event": Push.SNAPSHOT, "data": self.status})
            self._subscribers.add(queue)
        try:
            writer.write(snapshot)
            await writer.drain()
            while True:
                writer.write(await queue.get())
                await writer.drain()
        finally:
            self._subscribers.discard(queue)

    def _reply(self, request: dict) -> dict:
        request_id = request.get("id")
        method = request.get("method")
        params = request.get("params") or {}
        if method not in self._methods:
            return error_reply(request_id, UNKNOWN_METHOD, f"unknown method {method!r}", f"use one of: {', '.join(METHODS)}")
        try:
            with self._lock:
                result = self._methods[method](params)
        except RequestError as error:
            return error_reply(request_id, error.code, error.message, error.fix)
        return {"id": request_id, "protocol": PROTOCOL_VERSION, "result": copy.deepcopy(result)}

    # ----- the methods (DEVELOPERS.md), with the rules of daemon/methods.py and supervisor.py -----

    def _status(self, params: dict) -> dict:
        return self.status

    def _peers(self, params: dict) -> dict:
        run = self.status.get("run") or {}
        return _typed(PeersResult, {"run_id": run.get("id"), "peers": self.peers if run else [], "bans": []})

    def _metrics(self, params: dict) -> dict:
        since = params.get("since") or 0
        rows = [row for row in self.steps if row["ts"] > since]
        return {"steps": rows[-int(params.get("limit") or 1000):]}

    def _epochs(self, params: dict) -> dict:
        return {"epochs": self.epochs[-int(params.get("limit") or 20):]}

    def _events(self, params: dict) -> dict:
        since = params.get("since") or 0
        rows = [row for row in self.events if row["ts"] > since]
        return _typed(EventsResult, {"events": rows[-int(params.get("limit") or 200):]})

    def _require_in_run(self, verb: str) -> None:
        if self.status["state"] not in IN_RUN:
            raise RequestError(INVALID_STATE, f"cannot {verb}: not in a run", "join one first: p2ptrain join RUN --peers MULTIADDR")

    def _join(self, params: dict) -> dict:
        run_id = params.get("run")
        if not isinstance(run_id, str) or not run_id:
            raise _bad(f"run must be a non-empty string, not {run_id!r}", 'send e.g. {"run": "..."}')
        if not params.get("new_run") and not params.get("initial_peers"):
            raise _bad(
                f"to join the existing run {run_id!r} this peer needs a bootstrap address",
                f"pass --peers MULTIADDR (a peer's local.addresses), or create it: p2ptrain join --new-run {run_id}",
            )
        state = self.status["state"]
        if state in IN_RUN or state == "leaving":
            raise RequestError(INVALID_STATE, f"already in run {self.status['run']['id']!r} ({state})", "leave it first: p2ptrain leave")
        self._record_event("join", f"joining run {run_id!r}", {"new_run": bool(params.get("new_run"))})
        self._set_status(joining_status(run_id, planned=bool(params.get("new_run"))))
        return _typed(JoinResult, {**self.status, "warnings": []})

    def _pause(self, params: dict) -> dict:
        for_s = _number(params, "for_s", minimum=1)
        self._require_in_run("pause")
        until = f" for {for_s:.0f} s" if for_s else ""
        self._record_event("paused", f"paused (user){until}", {"reason": "user", "for_s": for_s})
        status = paused_status("user", paused_until=FROZEN_NOW + for_s if for_s else None)
        if self.status["state"] == "joining":  # the daemon's plan only, if it had made one
            local = self.status["local"] and {**self.status["local"], "workers": [
                {**worker, "state": "paused"} for worker in self.status["local"]["workers"]]}
            status.update(local=local, run=self.status["run"])
        status["run"]["id"] = self.status["run"]["id"]
        self._set_status(status)
        return self.status

    def _resume(self, params: dict) -> dict:
        self._require_in_run("resume")
        state = self.status["state"]
        if state in ("paused", "finishing"):
            self._record_event("resumed", "resumed training")
            local = self.status["local"]
            joined = bool(local and local.get("peer_id"))
            status = training_status() if joined else joining_status(self.status["run"]["id"], planned=local is not None)
            status["run"]["id"] = self.status["run"]["id"]
            self._set_status(status)
        elif self.status.get("paused_until") is not None:
            self._set_status({**self.status, "paused_until": None})
        return self.status

    def _finish(self, params: dict) -> dict:
        self._require_in_run("finish")
        if self.status["state"] == "paused":
            raise RequestError(INVALID_STATE, "already paused", "resume first: p2ptrain resume")
        self._record_event("finishing", "finishing the current epoch, then pausing")
        self._set_status({**self.status, "state": "finishing", "pause_reason": None, "since": FROZEN_NOW})
        return self.status

    def _leave(self, params: dict) -> dict:
        if self.status["state"] == "error":
            self._record_event("left", "error acknowledged; idle")
            self._set_status(idle_status())
            return self.status
        self._require_in_run("leave")
        run_id = self.status["run"]["id"]
        self._record_event("leaving", f"leaving run {run_id!r}")
        self._set_status({**self.status, "state": "leaving", "pause_reason": None, "paused_until": None, "since": FROZEN_NOW})
        self._loop.call_later(LEAVE_S, self._worker_left, run_id)
        return self.status

    def _worker_left(self, run_id: str) -> None:
        with self._lock:
            self._record_event("left", f"left run {run_id!r}")
            self._set_status(idle_status())

    def _config_get(self, params: dict) -> dict:
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
