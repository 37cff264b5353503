"""Nothing a daemon starts is left in /tmp or /dev/shm: not after a clean stop, and not after a SIGKILL (its
next start cleans up).

Each daemon runs in its own mount namespace whose /tmp and /dev/shm are
directories of this test (bind-mounted), so every file anything creates "in
/tmp" (p2pd and hivemind sockets, torch's and multiprocessing's directories)
or in /dev/shm (torch's shared tensors: RAM until reboot on a real machine) is
visible here, and the other programs on this machine neither add to it nor
see it. Needs root (unshare, mount).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from daemons import P2PTRAIN, DaemonProcess, child_environment, cli, write_local_config

pytestmark = [
    pytest.mark.swarm,
    pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare for a private /tmp"),
]


def start_with_private_tmp(fake_tmp: Path, name: str) -> DaemonProcess:
    """``p2ptrain daemon --home /tmp/NAME`` in a mount namespace where /tmp is ``fake_tmp`` and /dev/shm is
    ``shared_memory(fake_tmp)``."""
    home = fake_tmp / name
    write_local_config(home)
    log_path = fake_tmp.parent / f"{name}-{time.time_ns()}.log"
    mounts = f'mount --bind "{shared_memory(fake_tmp)}" /dev/shm && mount --bind "{fake_tmp}" /tmp'
    command = ["unshare", "--mount", "--propagation", "private", "sh", "-c", f'{mounts} && exec "$@"',
               "sh", *P2PTRAIN, "daemon", "--home", f"/tmp/{name}"]
    with open(log_path, "w") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=child_environment(), start_new_session=True)
    daemon = DaemonProcess(home, process, log_path)  # the socket is the same file inside and out
    daemon.wait_until(lambda status: True, timeout=60, interval=0.2, what="the daemon to answer")
    return daemon


def shared_memory(fake_tmp: Path) -> Path:
    """The directory the daemons see as /dev/shm."""
    return fake_tmp.parent / "shm"


def left_in_shared_memory(fake_tmp: Path) -> set[str]:
    """The files in the daemons' /dev/shm."""
    return {path.name for path in shared_memory(fake_tmp).iterdir()}


def left_in_tmp(fake_tmp: Path, homes: set[str]) -> list[str]:
    """Everything in the private /tmp except the daemons' homes, as relative paths."""
    return sorted(str(path.relative_to(fake_tmp)) for path in fake_tmp.rglob("*") if path.relative_to(fake_tmp).parts[0] not in homes)


@pytest.mark.timeout(420)
def test_a_clean_stop_leaves_nothing_in_tmp_and_a_killed_daemons_files_go_at_its_next_start(short_tmp):
    fake_tmp = short_tmp / "tmp"
    fake_tmp.mkdir()
    shared_memory(fake_tmp).mkdir()
    foreign = fake_tmp / "hivemind-p2pclient-someone-else.sock"  # another program's file
    foreign.touch()
    homes = {"a", "b"}
    started = []
    try:
        other = start_with_private_tmp(fake_tmp, "b")  # a second daemon, idle, beside A all along
        started.append(other)
        other_files = set(left_in_tmp(fake_tmp, homes))
        daemon = start_with_private_tmp(fake_tmp, "a")
        started.append(daemon)
        assert cli(daemon.home, "join", "--new-run", "tmp-files", "--mode", "sync").returncode == 0
        daemon.wait_until(lambda s: s["state"] == "training" and (s.get("local") or {}).get("samples_per_second"), 240, what="training")

        daemon.kill()  # SIGKILL of the daemon and its worker group
        leftovers = {path for path in set(left_in_tmp(fake_tmp, homes)) - other_files - {foreign.name} if not (fake_tmp / path).is_dir()}
        assert any("hivemind-p2pd-" in path for path in leftovers), leftovers  # what a killed daemon leaves
        shared_leftovers = left_in_shared_memory(fake_tmp)
        assert any(name.startswith("torch_") for name in shared_leftovers), shared_leftovers  # in RAM, until reboot

        daemon = start_with_private_tmp(fake_tmp, "a")  # rejoins its run by itself
        started[1] = daemon
        now_there = set(left_in_tmp(fake_tmp, homes))
        assert not leftovers & now_there, leftovers & now_there
        assert not shared_leftovers & left_in_shared_memory(fake_tmp), shared_leftovers & left_in_shared_memory(fake_tmp)
        assert other_files <= now_there and foreign.exists()  # another daemon's files and another program's stay
        daemon.wait_until(lambda s: s["state"] == "training", 240, what="training again after the restart")

        assert daemon.terminate(timeout=120) == 0
        assert set(left_in_tmp(fake_tmp, homes)) == other_files | {foreign.name}
        assert left_in_shared_memory(fake_tmp) == set()  # the idle daemon B shares no tensors
        assert other.terminate(timeout=60) == 0
        assert left_in_tmp(fake_tmp, homes) == [foreign.name]
    finally:
        for process in started:
            process.terminate(timeout=30)
            process.kill()
