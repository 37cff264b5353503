"""The TUI against a real daemon that is training in a run: under Textual's test driver, and in tmux.

Both tests share one daemon (joining a new run takes a minute or two on a
loaded machine); each one resumes it first if an earlier test left it paused.
"""

from __future__ import annotations

import json

import pytest
from conftest import wait_until
from tmux import TMUX, TmuxPane, tui_command

from daemons import cli, start_daemon, write_local_config
from p2ptrain.tui.app import P2PTrainApp
from p2ptrain.tui.connection import find_daemon

pytestmark = [pytest.mark.timeout(300), pytest.mark.swarm]

RUN = "tui-real"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    home = tmp_path_factory.mktemp("real")
    write_local_config(home)
    daemon = start_daemon(home)
    try:
        assert cli(home, "join", "--new-run", RUN, "--target-batch-size", "64").returncode == 0
        daemon.wait_until(lambda status: status["state"] == "training", 180, what="training")
        yield daemon
    finally:
        daemon.terminate(timeout=60)
        daemon.kill()


@pytest.fixture
def training_daemon(daemon):
    """The shared daemon, training (resumed if an earlier test paused it)."""
    if daemon.status()["state"] == "paused":
        assert cli(daemon.home, "resume").returncode == 0
    daemon.wait_until(lambda status: status["state"] == "training", 120, what="training")
    return daemon


def cli_state(home) -> str:
    return json.loads(cli(home, "status", "--json").stdout)["state"]


@pytest.mark.asyncio
async def test_tui_shows_a_real_run_pauses_it_for_a_while_and_quits_leaving_the_daemon_up(training_daemon):
    app = P2PTrainApp(find_daemon(training_daemon.home))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.state == "training", timeout=10, what="the training state")
        assert app.view.run_id == RUN
        await wait_until(pilot, lambda: app.view.steps and app.charts_ready, timeout=30, what="the steps pushed")
        await pilot.press("t")
        await wait_until(pilot, lambda: app.screen.query("#pause-duration"), what="the timed pause dialog")
        await pilot.press(*"1h30m", "enter")
        await wait_until(pilot, lambda: app.state == "paused", timeout=10, what="the paused state")
        status = json.loads(cli(training_daemon.home, "status", "--json").stdout)
        assert (status["state"], status["pause_reason"]) == ("paused", "user")
        assert 5300 < status["paused_until"] - status["since"] < 5500
        await pilot.press("q")
    assert training_daemon.status()["state"] == "paused"


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed (apt-get install tmux): no real terminal to test in")
def test_tui_in_tmux_pauses_on_p_alone_and_quits_on_q(training_daemon):
    home = training_daemon.home
    with TmuxPane(120, 40) as pane:
        pane.run(tui_command(home))
        # How fast this appears is measured by benchmarks/tui_first_frame.py, not asserted here.
        pane.wait_for(lambda screen: "TRAINING" in screen and RUN in screen, timeout=30, what=f"TRAINING and {RUN}")
        pane.send("p")
        # One key, no dialog: the daemon is paused before anything else is pressed.
        training_daemon.wait_until(lambda status: status["state"] == "paused", 15, interval=0.1, what="paused after p")
        assert cli_state(home) == "paused"
        pane.wait_for(lambda screen: "PAUSED" in screen and "p Resume" in screen, timeout=15, what="PAUSED on screen")
        pane.send("q")
        pane.wait_for(lambda _: pane.exited, timeout=15, what="the TUI to exit")
    # The daemon outlives the TUI and still answers.
    assert cli_state(home) == "paused"
    assert training_daemon.process.poll() is None
