"""Follow the daemon's ``subscribe`` stream, so that a change shows without waiting for the next poll.

The stream only says *that* something changed (the daemon pushes its status on
a state change, and each new epoch, event and peers table); the TUI still
fetches what it shows with its polls, which also carry what the stream does
not (progress within an epoch, the GPU). So a pause from the CLI or by the
daemon's policy appears at once, and the polls can stay unhurried.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable

from p2ptrain.protocol import MAX_LINE_BYTES, encode

# Pushed events that mean the dashboard is out of date. Not "step": the daemon
# pushes one per training step, and the regular polls keep up with those.
CHANGES = frozenset({"status", "epoch", "event", "peers"})
# Seconds between attempts to subscribe while the daemon is not running.
RETRY_S = 2.0


async def follow_changes(socket_path: str | os.PathLike, on_change: Callable[[], None], retry_s: float = RETRY_S) -> None:
    """Call ``on_change`` for every change the daemon pushes, until cancelled.

    Reconnects when the daemon restarts; while none answers it tries again
    every ``retry_s`` seconds and says nothing (the polls report the daemon's
    absence). A daemon that refuses ``subscribe`` leaves only the polls.

    Args:
        socket_path: the daemon's control socket.
        on_change: called (in the caller's event loop) for each pushed change.
        retry_s: seconds to wait before subscribing again.
    """
    while True:
        try:
            reader, writer = await asyncio.open_unix_connection(str(socket_path), limit=MAX_LINE_BYTES * 8)
        except OSError:
            await asyncio.sleep(retry_s)
            continue
        try:
            writer.write(encode({"id": 1, "method": "subscribe", "params": {}}))
            await writer.drain()
            while line := await reader.readline():
                message = json.loads(line)
                if isinstance(message, dict) and message.get("event") in CHANGES:
                    on_change()
        except (OSError, ValueError):
            # The daemon went away mid-line, or sent something that is not a protocol line.
            pass
        finally:
            writer.close()
        await asyncio.sleep(retry_s)
