"""The daemon's own temporary directory, so that nothing it starts is left in /tmp (or in /dev/shm).

hivemind (p2pd's and its clients' sockets), torch (``torch_shm_manager``'s
directory, inductor's cache) and multiprocessing (``pymp-*`` listeners) put
files in the temporary directory; some never remove them, and nothing does
when its process is killed. So the daemon gives itself a private directory
(``TMPDIR``; hivemind's socket prefix follows it, see ``peers/net/dht.py``) and
each worker a subdirectory of it, removes a worker's once the worker's
process group has ended, the whole directory when the daemon stops, and the
one a killed daemon left behind when the daemon starts again.

The directory is named after the state directory, whose lock the daemon holds
(``main.py``): a daemon never touches another daemon's files. Its path is
recorded in ``state/temp-dir`` for people looking for it.

Shared memory too: hivemind makes torch share tensors between a worker's
processes by file name (torch's ``file_system`` strategy), and the files,
``/dev/shm/torch_<pid>_*`` of the process that made each, outlive the group:
RAM (tmpfs) held until the machine reboots. A clean stop of a worker training
the ``tiny`` model left 41 of them (3 MiB); a real model's parameters and
averaging buffers are far larger, and a month of restarts adds them up. The
daemon notes the pids of each worker's processes while it runs (in its pgid
file as well, for the next daemon after a SIGKILL) and
:func:`remove_shared_memory` removes their files once the group has ended.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterable

from p2ptrain.paths import Paths

log = logging.getLogger(__name__)

RECORD_NAME = "temp-dir"
SHARED_MEMORY = Path("/dev/shm")


def daemon_temp_dir(paths: Paths) -> Path:
    """The daemon's private temporary directory: ``/tmp/p2ptrain-tmp-<hash of
    the state directory>`` (not under ``TMPDIR``: the daemon sets that to this
    directory, and a long one would not fit a socket path)."""
    digest = hashlib.sha256(os.fsencode(paths.state_dir.resolve())).hexdigest()[:16]
    return Path("/tmp") / f"p2ptrain-tmp-{digest}"


def worker_temp_dir(paths: Paths, worker: str) -> Path:
    """The temporary directory of one worker (``cpu``, ``gpu1``...): its ``TMPDIR``."""
    return daemon_temp_dir(paths) / worker


def take_temp_dir(paths: Paths) -> Path:
    """Remove what a killed daemon of this state directory left, create the
    directory afresh (mode 0700), record it, and make it this process's
    ``TMPDIR`` (inherited by the workers). Call it holding the state lock,
    after ending the leftover worker groups."""
    directory = daemon_temp_dir(paths)
    if directory.exists():
        log.info("removing %s, left by a daemon that did not stop cleanly", directory)
        shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(mode=0o700, parents=True)
    (paths.state_dir / RECORD_NAME).write_text(f"{directory}\n")
    os.environ["TMPDIR"] = str(directory)
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    return directory


def remove_worker_temp_dir(directory: str | os.PathLike | None) -> None:
    """Remove a worker's temporary directory once its process group has ended (None: nothing to do)."""
    if directory:
        shutil.rmtree(directory, ignore_errors=True)


def give_back_temp_dir(paths: Paths) -> None:
    """On a clean stop: remove the daemon's temporary directory and its record,
    and the runtime directory when it is an empty fallback under /tmp."""
    shutil.rmtree(daemon_temp_dir(paths), ignore_errors=True)
    (paths.state_dir / RECORD_NAME).unlink(missing_ok=True)
    if paths.runtime_dir.parent == Path("/tmp"):
        try:
            paths.runtime_dir.rmdir()  # only if empty: a client may have left nothing else there
        except OSError:
            pass


def remove_shared_memory(pids: Iterable[int]) -> int:
    """Remove the shared-memory files torch made for the processes ``pids`` (``/dev/shm/torch_<pid>_*``),
    once they have ended; returns how many it removed. Files of other processes stay."""
    prefixes = tuple(f"torch_{pid}_" for pid in pids)
    if not prefixes:
        return 0
    try:
        names = os.listdir(SHARED_MEMORY)
    except OSError:
        return 0
    removed = 0
    for name in names:
        if name.startswith(prefixes):
            try:
                os.unlink(SHARED_MEMORY / name)
                removed += 1
            except OSError:
                pass
    return removed
