"""The TUI against a real daemon that is training in a run."""

from __future__ import annotations

import json

import pytest
from conftest import wait_until

from daemons import cli, start_daemon, write_local_config
from p2ptrain.tui.app import P2PTrainApp
from p2ptrain.tui.connection import find_daemon

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(300), pytest.mark.swarm]


@pytest.fixture
def training_daemon(tmp_path):
    home = tmp_path / "real"
    write_local_config(home)
    daemon = start_daemon(home)
    try:
        assert cli(home, "join", "--new-run", "tui-real", "--target-batch-size", "64").returncode == 0
        daemon.wait_until(lambda status: status["state"] == "training", 180, what="training")
        yield daemon
    finally:
        daemon.terminate(timeout=60)
        daemon.kill()


async def test_tui_shows_a_real_run_pauses_it_and_quits_leaving_the_daemon_up(training_daemon):
    app = P2PTrainApp(find_daemon(training_daemon.home), poll_interval_s=0.5)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.state == "training", timeout=10, what="the training state")
        assert app.snapshot.status["run"]["id"] == "tui-real"
        await pilot.press("p")
        await wait_until(pilot, lambda: app.screen.query("#pause-duration"), what="the pause dialog")
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.state == "paused", timeout=10, what="the paused state")
        status = json.loads(cli(training_daemon.home, "status", "--json").stdout)
        assert (status["state"], status["pause_reason"]) == ("paused", "user")
        await pilot.press("q")
    assert training_daemon.status()["state"] == "paused"
