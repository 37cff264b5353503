"""The daemon as a user meets it: a real process, a real socket, the real CLI."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import stat
import threading
import time

import pytest

from daemons import cli, raw_exchange, start_daemon
from p2ptrain.paths import resolve_paths
from p2ptrain.protocol import ControlClient, DaemonError

pytestmark = pytest.mark.timeout(120)


def test_status_without_daemon_exits_3_with_state_stopped(short_tmp):
    result = cli(short_tmp / "nothing", "status", "--json")
    assert result.returncode == 3
    assert json.loads(result.stdout)["state"] == "stopped"


@pytest.mark.parametrize("command", [["status"], ["pause"], ["resume"], ["leave"], ["peers"], ["events"], ["config", "show"], ["join", "r", "--peers", "/ip4/127.0.0.1/tcp/1"]])
def test_every_command_says_in_one_line_how_to_start_the_daemon(short_tmp, command):
    result = cli(short_tmp / "nothing", *command)
    output = (result.stdout + result.stderr).strip()
    assert result.returncode == 3
    assert len(output.splitlines()) == 1
    assert "p2ptrain daemon --home" in output


def test_daemon_starts_idle_with_a_private_socket(daemons):
    daemon = daemons.start()
    result = cli(daemon.home, "status", "--json")
    assert result.returncode == 5, result.stderr
    status = json.loads(result.stdout)
    assert status["state"] == "idle"
    assert status["protocol"] == 1
    socket_path = resolve_paths(daemon.home).socket
    assert stat.S_IMODE(os.stat(socket_path).st_mode) == 0o600


def test_human_status_reads_like_systemctl(daemons):
    daemon = daemons.start()
    result = cli(daemon.home, "status")
    assert result.stdout.splitlines()[0].startswith("○ p2ptrain: idle since ")


@pytest.mark.parametrize(
    "payload, code",
    [
        (b"not json\n", "bad-request"),
        (b"\x00\xff\xfe binary garbage \x80\n", "bad-request"),
        (b'{"id":1,"method":"status","params":"nope"}\n', "bad-request"),
        (b'[1, 2, 3]\n', "bad-request"),
        (b'{"id":1,"method":42}\n', "bad-request"),
        (b'{"id":1,"method":"reboot"}\n', "unknown-method"),
        (b'{"id":1,"method":"pause","params":{"for_s":"soon"}}\n', "bad-request"),
        (b'{"id":1,"method":"join","params":{"run":"x","initial_peers":["nope"]}}\n', "bad-request"),
        (b'{"id":1,"method":"join","params":{"run":"Bad Name!","new_run":true}}\n', "bad-request"),
        (b'{"id":1,"method":"join","params":{"run":"r","new_run":true,"manifest":{"mode":"fast"}}}\n', "bad-request"),
        (b'{"id":1,"method":"config.set","params":{"key":"storage.flush_interval_s","value":"-3"}}\n', "bad-request"),
        (b'{"id":1,"method":"pause"}\n', "invalid-state"),
        (b'{"id":1,"protocol":2,"method":"status"}\n', "protocol-mismatch"),
    ],
)
def test_bad_requests_get_an_error_reply_and_the_daemon_keeps_answering(daemons, payload, code):
    daemon = daemons.start()
    socket_path = resolve_paths(daemon.home).socket
    replies = raw_exchange(socket_path, payload)
    assert replies[0]["error"]["code"] == code
    assert replies[0]["error"]["message"]
    assert daemon.status()["state"] == "idle"


def test_oversized_line_gets_too_large_and_the_connection_stays_usable(daemons):
    daemon = daemons.start()
    socket_path = resolve_paths(daemon.home).socket
    payload = b'{"id":1,"method":"status","params":{"x":"' + b"a" * (2 << 20) + b'"}}\n' + b'{"id":2,"method":"status"}\n'
    replies = raw_exchange(socket_path, payload, timeout=30)
    assert replies[0]["error"]["code"] == "too-large"
    assert replies[1]["id"] == 2 and replies[1]["result"]["state"] == "idle"


def test_fifty_concurrent_clients_and_a_silent_one_all_get_answers(daemons):
    daemon = daemons.start()
    socket_path = resolve_paths(daemon.home).socket
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.connect(str(socket_path))  # connects and never says anything
    answers: list[str] = []
    errors: list[BaseException] = []

    def ask() -> None:
        try:
            answers.append(ControlClient(str(socket_path), timeout=20).call("status")["state"])
        except BaseException as error:  # noqa: BLE001 - reported by the assertion below
            errors.append(error)

    threads = [threading.Thread(target=ask) for _ in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    silent.close()
    assert errors == []
    assert answers == ["idle"] * 50


def test_sigterm_stops_within_5_s_with_exit_0_and_leaves_a_sound_database(daemons):
    daemon = daemons.start()
    started = time.monotonic()
    assert daemon.terminate(timeout=5) == 0
    assert time.monotonic() - started < 5
    database = resolve_paths(daemon.home).database
    with sqlite3.connect(database) as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        kinds = [row[0] for row in connection.execute("SELECT kind FROM events ORDER BY ts")]
    assert kinds[0] == "daemon-started" and kinds[-1] == "daemon-stopped"
    assert not resolve_paths(daemon.home).socket.exists()


def test_a_second_daemon_on_the_same_home_is_refused(daemons):
    daemon = daemons.start()
    second = start_daemon(daemon.home, wait=False)
    assert second.process.wait(30) == 1
    assert "already runs" in second.log()
    assert daemon.status()["state"] == "idle"


def test_a_home_too_deep_for_a_unix_socket_still_works(daemons, short_tmp):
    deep = "d" * 60 + "/" + "e" * 60
    daemon = daemons.start(name=deep)
    socket_path = resolve_paths(daemon.home).socket
    assert len(os.fsencode(socket_path)) <= 107
    assert (daemon.home / "run-dir").read_text().strip() == str(socket_path.parent)
    assert json.loads(cli(daemon.home, "status", "--json").stdout)["state"] == "idle"


def test_config_set_validates_persists_and_survives_a_restart(daemons):
    daemon = daemons.start()
    result = cli(daemon.home, "config", "set", "training.checkpoint_interval_s", "120")
    assert result.returncode == 0, result.stderr
    bad = cli(daemon.home, "config", "set", "training.checkpoint_interval_s", "soon")
    assert bad.returncode == 2
    assert len(bad.stderr.strip().splitlines()) == 1 and "training.checkpoint_interval_s" in bad.stderr
    unknown = cli(daemon.home, "config", "set", "training.turbo", "true")
    assert unknown.returncode == 2 and "unknown config key" in unknown.stderr
    assert daemon.terminate() == 0
    daemon = daemons.start()
    assert cli(daemon.home, "config", "get", "training.checkpoint_interval_s").stdout.strip() == "120.0"


def test_a_config_that_is_not_toml_stops_the_daemon_with_one_line(short_tmp):
    home = short_tmp / "broken"
    home.mkdir()
    (home / "config.toml").write_text("this is [not toml\n")
    result = cli(home, "daemon")
    assert result.returncode != 0
    assert "not valid TOML" in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_subscribe_streams_a_snapshot_then_changes(daemons):
    daemon = daemons.start()
    stream = daemon.client.subscribe(timeout=10)
    first = next(stream)
    assert first["event"] == "snapshot" and first["data"]["state"] == "idle"
    daemon.client.call("config.set", key="nickname", value="renamed")
    # the status is pushed whenever it changes (here: the hardware readings), between other changes
    pushed = next(message for message in stream if message["event"] != "status")
    assert pushed["event"] == "event" and pushed["data"]["kind"] == "config-changed"
    stream.close()


def test_sd_notify_ready_status_and_stopping(daemons, short_tmp):
    notify_path = short_tmp / "notify.sock"
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind(str(notify_path))
    receiver.settimeout(10)
    try:
        daemon = daemons.start(env={"NOTIFY_SOCKET": str(notify_path), "WATCHDOG_USEC": "2000000"})
        datagrams = [receiver.recv(4096).decode()]
        while "READY=1" not in datagrams[-1]:
            datagrams.append(receiver.recv(4096).decode())
        while "WATCHDOG=1" not in datagrams[-1]:
            datagrams.append(receiver.recv(4096).decode())
        daemon.terminate()
        while "STOPPING=1" not in datagrams[-1]:
            datagrams.append(receiver.recv(4096).decode())
    finally:
        receiver.close()
    assert any(d.startswith("READY=1") and "STATUS=idle" in d for d in datagrams)
    assert "STOPPING=1" in datagrams[-1]


def test_a_cli_and_a_daemon_of_other_protocols_refuse_each_other_in_one_line(short_tmp):
    """A daemon left running across an upgrade: the CLI names the mismatch and the fix instead of misreading."""
    socket_path = resolve_paths(short_tmp / "home").socket
    socket_path.parent.mkdir(parents=True, exist_ok=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(socket_path))
        server.listen()

        def answer_as_a_newer_daemon() -> None:
            while True:
                try:
                    connection, _ = server.accept()
                except OSError:
                    return
                with connection:
                    request = json.loads(connection.makefile("rb").readline())
                    reply = {"id": request["id"], "protocol": 2, "result": {"state": "idle", "protocol": 2}}
                    connection.sendall(json.dumps(reply).encode() + b"\n")

        threading.Thread(target=answer_as_a_newer_daemon, daemon=True).start()
        result = cli(short_tmp / "home", "status")
        server.shutdown(socket.SHUT_RDWR)
    output = (result.stdout + result.stderr).strip()
    assert result.returncode != 0 and len(output.splitlines()) == 1, output
    assert "control protocol 2" in output and "restart the daemon" in output


def test_unknown_method_error_carries_the_list_of_methods(daemons):
    daemon = daemons.start()
    with pytest.raises(DaemonError) as raised:
        daemon.client.call("explode")
    assert raised.value.code == "unknown-method" and "status" in raised.value.fix


def test_a_daemon_a_test_started_ends_when_the_test_process_is_killed(short_tmp):
    # a test process stopped by SIGKILL runs no teardown: its daemons must not outlive it
    import subprocess
    import sys
    from pathlib import Path

    import psutil

    tests = Path(__file__).resolve().parents[1]
    script = (f"import os, signal, sys; sys.path.insert(0, {str(tests)!r}); from pathlib import Path; "
              f"from daemons import start_daemon; daemon = start_daemon(Path({str(short_tmp / 'orphan')!r})); "
              "print(daemon.process.pid, flush=True); os.kill(os.getpid(), signal.SIGKILL)")
    test_process = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert test_process.returncode == -9, test_process.stderr
    try:
        daemon = psutil.Process(int(test_process.stdout.split()[0]))
        daemon.wait(timeout=30)
    except psutil.NoSuchProcess:
        pass  # gone already
    except psutil.TimeoutExpired:
        daemon.kill()
        pytest.fail("the daemon outlived the test process that started it")
