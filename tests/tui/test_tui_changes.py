"""A change the daemon pushes (its ``subscribe`` stream) shows at once, not at the next poll.

The app polls only every two minutes here, so the state can change on
screen within the waits below only through the stream.
"""

from __future__ import annotations

import pytest
from conftest import make_app, wait_until
from fake_daemon import FakeDaemon, paused_status, training_status

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]

SLOW_POLLS_S = 120.0


async def test_a_pause_pushed_by_the_daemon_shows_without_waiting_for_the_next_poll(daemon):
    app = make_app(daemon.paths.home, poll_interval_s=SLOW_POLLS_S)
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: app.state == "training", what="the first poll")
        await wait_until(pilot, lambda: daemon.requests_for("subscribe"), what="the subscription")
        daemon.set_status(paused_status("battery"))
        await wait_until(pilot, lambda: app.state == "paused", what="the pushed pause on screen")
        assert app.snapshot.status["pause_reason"] == "battery"


async def test_subscribes_once_a_daemon_starts_after_the_tui_and_again_after_it_restarts(tmp_path):
    home = tmp_path / "home"
    app = make_app(home, poll_interval_s=SLOW_POLLS_S, retry_delays_s=(0.2,))
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: app.state is None and app.charts_ready, what="the unreachable screen")
        with FakeDaemon(home) as daemon:
            await wait_until(pilot, lambda: app.state == "training", what="the daemon's state")
            await wait_until(pilot, lambda: daemon.requests_for("subscribe"), what="the subscription")
            daemon.set_status(paused_status("user"))
            await wait_until(pilot, lambda: app.state == "paused", what="the pushed pause on screen")
        with FakeDaemon(home) as restarted:
            await wait_until(pilot, lambda: restarted.requests_for("subscribe"), timeout=20, what="a new subscription")
            restarted.set_status(training_status())
            await wait_until(pilot, lambda: app.state == "training", what="the pushed state of the restarted daemon")
