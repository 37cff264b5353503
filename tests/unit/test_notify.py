"""sd_notify: the exact datagrams systemd receives, on a real AF_UNIX socket."""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import uuid
from pathlib import Path

import pytest

from p2ptrain.daemon.notify import SystemdNotifier


@pytest.fixture
def socket_dir(tmp_path):
    """tmp_path, or a short directory when tmp_path is too long for AF_UNIX (107 bytes)."""
    if len(os.fsencode(tmp_path / "notify.sock")) <= 100:
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(prefix="sdn-", dir="/tmp") as short:
        yield Path(short)


@pytest.fixture
def listener(socket_dir):
    """A datagram socket standing in for systemd's notify socket: (NOTIFY_SOCKET value, socket)."""
    path = socket_dir / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(5)
        yield str(path), sock


def receive_all(sock: socket.socket) -> list[bytes]:
    sock.setblocking(False)
    datagrams = []
    while True:
        try:
            datagrams.append(sock.recv(4096))
        except BlockingIOError:
            return datagrams


def test_each_call_sends_one_datagram_in_sd_notify_format(listener, monkeypatch):
    address, sock = listener
    monkeypatch.setenv("NOTIFY_SOCKET", address)
    notifier = SystemdNotifier.from_environment()
    assert notifier.enabled

    notifier.ready("listening on /run/p2ptrain/control.sock")
    notifier.status("training: epoch 3, 12 peers")
    notifier.watchdog()
    notifier.stopping("checkpointing")

    assert receive_all(sock) == [
        b"READY=1\nSTATUS=listening on /run/p2ptrain/control.sock",
        b"STATUS=training: epoch 3, 12 peers",
        b"WATCHDOG=1",
        b"STOPPING=1\nSTATUS=checkpointing",
    ]


def test_ready_without_status_sends_only_ready(listener):
    address, sock = listener
    SystemdNotifier(address).ready()
    assert receive_all(sock) == [b"READY=1"]


def test_newlines_in_status_cannot_inject_other_fields(listener):
    address, sock = listener
    SystemdNotifier(address).status("paused\nREADY=1")
    assert receive_all(sock) == [b"STATUS=paused READY=1"]


def test_abstract_socket_address_starting_with_at(monkeypatch):
    name = f"p2ptrain-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        SystemdNotifier.from_environment().ready("up")
        assert sock.recv(4096) == b"READY=1\nSTATUS=up"


def test_without_notify_socket_every_call_is_a_no_op(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    notifier = SystemdNotifier.from_environment()
    assert not notifier.enabled
    notifier.ready("up")
    notifier.status("idle")
    notifier.watchdog()
    notifier.stopping("bye")


def test_a_vanished_socket_is_logged_not_raised(socket_dir, caplog):
    notifier = SystemdNotifier(str(socket_dir / "gone.sock"))
    with caplog.at_level(logging.DEBUG, logger="p2ptrain.daemon.notify"):
        notifier.watchdog()
        notifier.watchdog()
    levels = [record.levelno for record in caplog.records]
    assert levels == [logging.WARNING, logging.DEBUG]
    assert "gone.sock" in caplog.records[0].getMessage()


def test_watchdog_interval_is_half_of_watchdog_usec():
    notifier = SystemdNotifier.from_environment({"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "60000000"})
    assert notifier.watchdog_interval_s() == 30.0


def test_watchdog_meant_for_our_pid_is_honoured():
    environ = {"WATCHDOG_USEC": "10000000", "WATCHDOG_PID": str(os.getpid())}
    assert SystemdNotifier.from_environment(environ).watchdog_interval_s() == 5.0


def test_watchdog_meant_for_another_process_is_ignored():
    # A child that inherited the environment of the main process must not ping.
    environ = {"WATCHDOG_USEC": "10000000", "WATCHDOG_PID": str(os.getpid() + 1)}
    assert SystemdNotifier.from_environment(environ).watchdog_interval_s() is None


@pytest.mark.parametrize("value", [None, "", "abc", "0", "-5"])
def test_missing_or_malformed_watchdog_usec_means_no_watchdog(value):
    environ = {} if value is None else {"WATCHDOG_USEC": value}
    assert SystemdNotifier.from_environment(environ).watchdog_interval_s() is None
