"""Every hivemind request and message a peer's processes send or serve, one line each (for the lab).

The traffic meter (``traffic.py``) adds bytes up by kind; finding *which*
records cost them needs each request: the key a DHT request was made for, the
handler it went to, which side of it this process was, and its bytes. Set
``P2PTRAIN_REQUEST_LOG`` to a directory and every process of a worker (the
worker, its DHT process, the averagers) appends tab-separated lines to
``<directory>/<pid>.tsv`` (one directory per peer):

    time  direction  kind  what  key  sent  received

``direction`` is ``call`` (this process asked another peer), ``serve`` (it
answered one), ``stream`` (a streamed message, averaging or matchmaking) or
``read`` (a record read through ``local_reads``: ``what`` says whether the
local copy answered or why the network was asked; no bytes);
``what`` is the handler's name or the message type; ``key`` is the DHT key a
call was made for (the DHT process marks each ``dht.get``/``dht.store``) or,
when serving a DHT request, the hex of the first key's hash the request names
(a server sees only hashes: ``benchmarks/request_counts.py`` maps them back to
the names the callers logged). Unset (the default), nothing is logged.
"""

from __future__ import annotations

import os
import time

ENVIRONMENT_VARIABLE = "P2PTRAIN_REQUEST_LOG"
_files: dict[tuple[int, str], object] = {}


def enabled() -> bool:
    return bool(os.environ.get(ENVIRONMENT_VARIABLE))


def served_key(request) -> str:
    """The hex of the first DHT key a served request names ("" when it names none)."""
    keys = getattr(request, "keys", None)
    if keys:
        return bytes(keys[0]).hex()
    return ""


def record(direction: str, kind: str, what: str, key: str, sent: int, received: int) -> None:
    """Append one line to this process's log (opened on first use after each fork, and again
    when ``P2PTRAIN_REQUEST_LOG`` names another directory)."""
    pid, directory = os.getpid(), os.environ[ENVIRONMENT_VARIABLE]
    file = _files.get((pid, directory))
    if file is None:
        os.makedirs(directory, exist_ok=True)
        file = open(os.path.join(directory, f"{pid}.tsv"), "a", buffering=1)
        _files[pid, directory] = file
    file.write(f"{time.time():.6f}\t{direction}\t{kind}\t{what}\t{key}\t{sent}\t{received}\n")


def log_read(key: str, how: str) -> None:
    """Log a ``local_reads`` read of ``key``: ``how`` it was answered (when logging is on)."""
    if enabled():
        record("read", "", how, key, 0, 0)
