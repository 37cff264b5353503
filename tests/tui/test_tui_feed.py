"""The TUI follows what the daemon pushes: the history once, then each update, and nothing polled."""

from __future__ import annotations

import pytest
from conftest import make_app, wait_until
from fake_daemon import FakeDaemon
from fake_data import FROZEN_NOW, RUN_ID, idle_status, joining_status, paused_status, sample_peers, training_status

from p2ptrain.control_types import PeerRow, Status
from p2ptrain.tui.daemon_view import EPOCHS, STATUS, STEPS, DaemonView, History
from p2ptrain.tui.widgets.event_log import EventLog
from p2ptrain.tui.widgets.peers_table import PeersTable
from p2ptrain.tui.widgets.swarm_panel import SwarmPanel
from p2ptrain.tui.widgets.unreachable_panel import UnreachablePanel

pytestmark = pytest.mark.timeout(60)

HISTORY = ["epochs", "events", "metrics", "peers"]


def history_requests(daemon) -> list[str]:
    return sorted(method for method in daemon.methods_called() if method in HISTORY)


@pytest.mark.asyncio
async def test_pushed_steps_epochs_events_and_peers_reach_the_screen_without_a_request(daemon):
    app = make_app(daemon.paths.home)
    async with app.run_test(size=(200, 60)) as pilot:
        await wait_until(pilot, lambda: app.view is not None and app.view.events and app.charts_ready, what="the history")
        requests_before = list(daemon.methods_called())
        log_lines = len(app.query_one(EventLog).lines)
        step = {"ts": FROZEN_NOW + 1, "epoch": 42, "loss": 2.5, "samples": 32, "samples_per_second": 40.0, "worker": "gpu0"}
        epoch = {"epoch": 42, "started_at": FROZEN_NOW - 300, "ended_at": FROZEN_NOW + 2, "duration_s": 302.0,
                 "num_peers": 3, "global_samples": 4096, "loss": 2.6, "val_loss": 2.7, "averaged_with": 2, "worker": "gpu0"}
        event = {"ts": FROZEN_NOW + 3, "kind": "averaged", "message": "averaged with 2 peers", "data": None}
        newcomer = {**sample_peers()[1], "peer_id": "12D3KooWNewcomer", "nickname": "late-lynx"}
        daemon.push("step", step)
        daemon.push("epoch", epoch)
        daemon.push("event", event)
        daemon.push("peers", {"run_id": RUN_ID, "peers": [*sample_peers(), newcomer]})
        await wait_until(pilot, lambda: app.query_one(PeersTable).row_count == 4, what="the fourth peer")
        assert app.query_one("#loss-chart").chart.steps[-1] == step
        assert app.query_one("#epoch-chart").chart.epochs[-1]["epoch"] == 42
        assert app.query_one(SwarmPanel).last_averaging == FROZEN_NOW + 2
        assert len(app.query_one(EventLog).lines) == log_lines + 1
        assert daemon.methods_called() == requests_before, "a pushed update must not lead to a request"


@pytest.mark.asyncio
async def test_a_malformed_push_shows_the_daemon_unwell_in_one_line_naming_the_field(daemon):
    app = make_app(daemon.paths.home, retry_delays_s=(30.0,))  # no reconnection while the test looks
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: app.state == "training", what="training")
        broken = paused_status("battery")
        broken["local"]["workers"][0]["loss"] = "low"
        daemon.push_unchecked("status", broken)
        await wait_until(pilot, lambda: app.view is None, what="the daemon shown as unreachable")
        reason = app.query_one(UnreachablePanel).reason
        assert "the status push: local: workers[0]: loss must be a number or null, not 'low'" in reason
        assert "\n" not in reason


@pytest.mark.asyncio
async def test_a_state_change_pushed_by_the_daemon_shows_at_once(daemon):
    app = make_app(daemon.paths.home)
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: app.state == "training", what="training")
        daemon.set_status(paused_status("battery"))
        await wait_until(pilot, lambda: app.state == "paused", what="the pushed pause on screen")
        assert app.view.status.pause_reason == "battery"
    assert "status" not in daemon.methods_called()


@pytest.mark.asyncio
async def test_follows_a_daemon_that_starts_after_the_tui_and_again_after_it_restarts(tmp_path):
    home = tmp_path / "home"
    app = make_app(home, retry_delays_s=(0.2,))
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: app.state is None and app.charts_ready, what="the unreachable screen")
        with FakeDaemon(home) as daemon:
            await wait_until(pilot, lambda: app.state == "training", what="the daemon's state")
            daemon.set_status(paused_status("user"))
            await wait_until(pilot, lambda: app.state == "paused", what="the pushed pause on screen")
        await wait_until(pilot, lambda: app.state is None, what="disconnected after the daemon stopped")
        with FakeDaemon(home) as restarted:
            await wait_until(pilot, lambda: app.state == "training", timeout=20, what="the restarted daemon's state")
            await wait_until(pilot, lambda: history_requests(restarted) == HISTORY, what="the history fetched again")
            restarted.set_status(paused_status("temperature"))
            await wait_until(pilot, lambda: app.state == "paused", what="the pushed state of the restarted daemon")


@pytest.mark.asyncio
async def test_another_run_brings_its_own_history(tmp_path):
    with FakeDaemon(tmp_path / "home", idle_status()) as daemon:
        app = make_app(daemon.paths.home)
        async with app.run_test() as pilot:
            await wait_until(pilot, lambda: app.state == "idle" and daemon.requests_for("events"), what="idle")
            daemon.set_status(joining_status("wiki-lora"))
            await wait_until(pilot, lambda: len(daemon.requests_for("metrics")) == 2, what="the new run's history")
            assert daemon.requests_for("metrics")[1]["params"]["run_id"] == "wiki-lora"
            await wait_until(pilot, lambda: app.view.run_id == "wiki-lora", what="the new run on screen")


def test_a_step_pushed_while_the_history_was_fetched_is_kept_once():
    view = DaemonView(Status.from_dict(training_status()))
    first, second = ({"ts": FROZEN_NOW + offset, "loss": 3.0} for offset in (1, 2))
    assert view.apply("step", first) == {STEPS}
    view.load(History(run_id=RUN_ID, steps=[first, second]))
    assert view.apply("step", second) == frozenset()
    assert list(view.steps) == [first, second]


def test_a_step_of_one_worker_is_kept_after_another_workers_newer_one():
    view = DaemonView(Status.from_dict(training_status()))
    newer = {"ts": FROZEN_NOW + 2, "loss": 3.0, "worker": "gpu1"}
    older = {"ts": FROZEN_NOW + 1, "loss": 2.9, "worker": "gpu0"}
    assert view.apply("step", newer) == {STEPS}
    assert view.apply("step", older) == {STEPS}
    assert view.apply("step", older) == frozenset(), "the same step twice is kept once"
    assert list(view.steps) == [newer, older]


def test_each_worker_reports_an_epoch_and_the_view_keeps_one_row_per_epoch():
    view = DaemonView(Status.from_dict(training_status()))
    for worker in ("gpu0", "gpu1"):
        assert view.apply("epoch", {"epoch": 7, "ended_at": FROZEN_NOW, "duration_s": 60.0, "worker": worker}) == {EPOCHS}
    assert [row["epoch"] for row in view.epochs] == [7] and view.last_averaging == FROZEN_NOW


def test_a_status_of_another_run_clears_the_old_runs_history():
    view = DaemonView(Status.from_dict(training_status()))
    view.load(History(run_id=RUN_ID, peers=[PeerRow.from_dict(row) for row in sample_peers()], steps=[{"ts": FROZEN_NOW, "loss": 3.0}]))
    assert STATUS in view.apply("status", Status.from_dict(joining_status("next-run")))
    assert (view.peers, list(view.steps), view.epochs) == ((), [], [])
    assert view.apply("made-up-kind", {}) == frozenset()


@pytest.mark.asyncio
async def test_a_row_of_repeated_events_is_one_line_whose_count_grows(daemon):
    app = make_app(daemon.paths.home)
    async with app.run_test(size=(200, 60)) as pilot:
        await wait_until(pilot, lambda: app.view is not None and app.view.events and app.charts_ready, what="the history")
        log = app.query_one(EventLog)
        lines_before = len(log.lines)
        flood = {"ts": FROZEN_NOW + 3, "kind": "non-finite", "message": "skipped a batch with non-finite gradients",
                 "data": None, "count": 1, "last_ts": FROZEN_NOW + 3}
        daemon.push("event", flood)
        await wait_until(pilot, lambda: len(log.lines) == lines_before + 1, what="the first of the flood")
        # the daemon pushes the same row again as it grows (same ts and kind, a new count)
        daemon.push("event", {**flood, "count": 140, "last_ts": FROZEN_NOW + 20})
        daemon.push("event", {**flood, "count": 700, "last_ts": FROZEN_NOW + 87})
        await wait_until(pilot, lambda: "(x700 in 84 s)" in log.lines[-1].text, what="the grown count")
        assert len(log.lines) == lines_before + 1
        assert [event.count for event in app.view.events if event.kind == "non-finite"] == [700]
