"""No daemon: the TUI says so, names the command, starts a user daemon on request, and reconnects."""

from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path

import pytest
from conftest import make_app, wait_until
from fake_daemon import FakeDaemon
from textual.widgets import ContentSwitcher, Label

from p2ptrain.paths import resolve_paths
from p2ptrain.tui.app import main

pytestmark = pytest.mark.timeout(60)

FAKE_EXECUTABLE = [sys.executable, str(Path(__file__).with_name("fake_daemon.py"))]


def shown_body(app) -> str:
    return app.screen_stack[0].query_one(ContentSwitcher).current


@pytest.mark.asyncio
async def test_unreachable_daemon_shows_the_command_that_starts_it(tmp_path):
    home = tmp_path / "home"
    app = make_app(home)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: shown_body(app) == "unreachable", what="the unreachable panel")
        command = app.screen_stack[0].query_one("#unreachable-command", Label).render().plain
        assert command == f"p2ptrain daemon --home {home}"
        assert app.screen_stack[0].query_one("#start-daemon").display
        assert "DISCONNECTED" in app.screen_stack[0].query_one("#state", Label).render().plain


@pytest.mark.asyncio
async def test_connecting_until_a_slow_daemon_answers_then_disconnected_when_it_fails(tmp_path):
    home = tmp_path / "home"
    paths = resolve_paths(home)
    paths.create()
    # A daemon that accepts connections but never answers: the subscription waits for its snapshot.
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(paths.socket))
    listener.listen(8)
    try:
        app = make_app(home, request_timeout_s=6.0, retry_delays_s=(5.0,))
        async with app.run_test(size=(100, 30)) as pilot:
            state = app.screen_stack[0].query_one("#state", Label)
            await pilot.pause(0.3)
            assert state.render().plain.strip() == "CONNECTING"
            assert shown_body(app) is None  # no empty dashboard before the daemon's state is known
            await wait_until(pilot, lambda: shown_body(app) == "unreachable", timeout=30, what="unreachable after the timeout")
            assert state.render().plain.strip() == "DISCONNECTED"
    finally:
        listener.close()


@pytest.mark.asyncio
async def test_dashboard_appears_once_the_daemon_starts(tmp_path):
    home = tmp_path / "home"
    app = make_app(home, retry_delays_s=(0.2,))
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: shown_body(app) == "unreachable", what="the unreachable panel")
        with FakeDaemon(home):
            await wait_until(pilot, lambda: app.state == "training", what="the daemon's state")
            assert shown_body(app) == "dashboard"
        await wait_until(pilot, lambda: shown_body(app) == "unreachable", what="unreachable after the daemon stopped")


@pytest.mark.asyncio
async def test_start_button_launches_a_detached_daemon_and_connects(tmp_path):
    home = tmp_path / "home"
    app = make_app(home, retry_delays_s=(0.2,), daemon_command=FAKE_EXECUTABLE)
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            button = app.screen_stack[0].query_one("#start-daemon")
            await wait_until(pilot, lambda: button.region.width > 0, what="the start button")
            await pilot.click("#start-daemon")
            await wait_until(pilot, lambda: app.started_daemon is not None, what="the daemon process")
            await wait_until(pilot, lambda: app.state == "training", timeout=20, what="the started daemon's state")
            process = app.started_daemon
            assert process.args == [*FAKE_EXECUTABLE, "daemon", "--home", str(home)]
            # Its own session: closing the TUI's terminal does not hang it up.
            assert os.getsid(process.pid) == process.pid != os.getsid(0)
            assert (resolve_paths(home).log_dir / "daemon-start.log").exists()
        assert process.poll() is None, "quitting the TUI must leave the daemon running"
    finally:
        if app.started_daemon is not None:
            app.started_daemon.send_signal(signal.SIGTERM)
            app.started_daemon.wait(10)


@pytest.mark.asyncio
async def test_system_socket_offers_no_start_button(tmp_path, monkeypatch):
    monkeypatch.delenv("P2PTRAIN_HOME", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "runtime"))
    app = make_app(None)
    assert app.target.socket == tmp_path / "runtime" / "p2ptrain" / "control.sock"
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: shown_body(app) == "unreachable", what="the unreachable panel")
        assert app.screen_stack[0].query_one("#unreachable-command", Label).render().plain == "p2ptrain daemon"


def test_bad_theme_is_a_one_line_error(capsys, tmp_path):
    assert main(["--home", str(tmp_path), "--theme", "no-such-theme"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "unknown theme 'no-such-theme'" in error and "textual-light" in error

