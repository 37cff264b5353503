"""Who may talk to a daemon on this machine: its own user, or (system service) the group p2ptrain.

The other user is real: a child forked from the test drops to the uid of
``nobody`` (root ignores file modes, so the check needs a second, unprivileged
uid) and calls ``status`` with the same ``ControlClient`` the CLI uses. The
directories above each socket are opened to everyone, so only the socket's own
mode and group decide, and each refusal has a positive control that shows the
same child getting in when the mode or group allows it.

Forged metrics records and manifest records that fail the schema are refused
by the DHT validators: see tests/integration/test_dht_records.py.
"""

from __future__ import annotations

import asyncio
import grp
import json
import os
import pwd
import select
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest

from daemons import start_daemon, write_local_config
from p2ptrain.daemon.server import Broadcaster, ControlServer
from p2ptrain.paths import resolve_paths
from p2ptrain.protocol import ControlClient, DaemonError

pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.skipif(os.geteuid() != 0, reason="switching to another uid needs root"),
]

GROUP = "p2ptrain"


def call_status_as(user: str, socket_path: Path, groups: list[int], timeout: float = 20) -> dict:
    """Fork a child that becomes ``user`` (with only ``groups``), calls ``status`` on the socket and reports the outcome.

    Returns ``{"uid", "state"}`` when the daemon answered, ``{"uid", "code", "line"}`` for a DaemonError,
    or ``{"uid", "unexpected"}`` for anything else.
    """
    account = pwd.getpwnam(user)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        # The child: no pytest machinery from here on, and always os._exit.
        try:
            os.close(read_end)
            os.setgroups(groups)
            os.setgid(account.pw_gid)
            os.setuid(account.pw_uid)
            try:
                outcome = {"state": ControlClient(str(socket_path), timeout=10).call("status")["state"]}
            except DaemonError as error:
                outcome = {"code": error.code, "line": error.one_line()}
            except Exception as error:  # noqa: BLE001 - reported to the parent, which fails the test
                outcome = {"unexpected": repr(error)}
            outcome["uid"] = os.getuid()
            os.write(write_end, json.dumps(outcome).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        ready, _, _ = select.select([read_end], [], [], timeout)
        if not ready:
            os.kill(pid, signal.SIGKILL)
            raise AssertionError(f"the child running as {user} did not finish within {timeout} s")
        data = b""
        while chunk := os.read(read_end, 65536):
            data += chunk
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    return json.loads(data)


@pytest.fixture
def open_dir():
    """A directory everyone may traverse (mode 0755), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="p2p-sec-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.timeout(90)
def test_a_user_daemons_socket_refuses_another_user(open_dir):
    home = open_dir / "home"
    write_local_config(home)
    daemon = start_daemon(home)
    try:
        socket_path = resolve_paths(home).socket
        assert stat.S_IMODE(os.stat(socket_path).st_mode) == 0o600
        # Only the socket's own mode may stand in the way, not the directories above it.
        home.chmod(0o755)
        socket_path.parent.chmod(0o755)

        refused = call_status_as("nobody", socket_path, groups=[])
        assert refused["uid"] == pwd.getpwnam("nobody").pw_uid
        assert refused.get("code") == "permission-denied", refused
        assert "not allowed to open" in refused["line"] and "join the group 'p2ptrain'" in refused["line"]
        assert "\n" not in refused["line"]

        # Positive control: the same child gets in once the socket's mode lets it.
        socket_path.chmod(0o666)
        assert call_status_as("nobody", socket_path, groups=[]) == {"uid": refused["uid"], "state": "idle"}
        socket_path.chmod(0o600)

        assert daemon.status()["state"] == "idle", "the refused user did not disturb the daemon"
    finally:
        daemon.terminate(timeout=20)
        daemon.kill()


@pytest.fixture
def p2ptrain_group():
    """The system group p2ptrain, created for the test if this machine has none (and then removed)."""
    try:
        existing = grp.getgrnam(GROUP)
    except KeyError:
        existing = None
    if existing is not None:
        yield existing
        return
    if shutil.which("groupadd") is None:
        pytest.skip("no group p2ptrain and no groupadd to create it")
    created = subprocess.run(["groupadd", "--system", GROUP], capture_output=True, text=True)
    if created.returncode != 0:
        pytest.skip(f"groupadd --system {GROUP} failed: {created.stderr.strip()}")
    try:
        yield grp.getgrnam(GROUP)
    finally:
        subprocess.run(["groupdel", GROUP], check=True)


class ServerThread:
    """A ``ControlServer`` with a ``status`` method, on an event loop in a background thread."""

    def __init__(self, socket_path: Path, group: str | None):
        async def status(params: dict) -> dict:
            return {"state": "idle"}

        self.server = ControlServer(socket_path, {"status": status}, Broadcaster(lambda: {"state": "idle"}), group=group)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> "ServerThread":
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(10)
        return self

    def __exit__(self, *exc_info) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.mark.timeout(60)
def test_the_system_socket_is_for_the_group_p2ptrain(open_dir, p2ptrain_group):
    socket_path = open_dir / "control.sock"
    with ServerThread(socket_path, group=GROUP):
        mode = os.stat(socket_path)
        assert stat.S_IMODE(mode.st_mode) == 0o660
        assert mode.st_gid == p2ptrain_group.gr_gid

        member = call_status_as("nobody", socket_path, groups=[p2ptrain_group.gr_gid])
        assert member == {"uid": pwd.getpwnam("nobody").pw_uid, "state": "idle"}
        outsider = call_status_as("nobody", socket_path, groups=[])
        assert outsider.get("code") == "permission-denied", outsider
        assert "join the group 'p2ptrain'" in outsider["line"]
    assert not socket_path.exists(), "the server removes its socket when it stops"


@pytest.mark.timeout(60)
def test_without_a_group_the_socket_is_private_to_its_user(open_dir):
    socket_path = open_dir / "control.sock"
    with ServerThread(socket_path, group=None):
        assert stat.S_IMODE(os.stat(socket_path).st_mode) == 0o600
        assert os.stat(socket_path).st_uid == os.geteuid()
        assert ControlClient(str(socket_path), timeout=10).call("status") == {"state": "idle"}
