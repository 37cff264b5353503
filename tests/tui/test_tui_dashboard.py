"""The dashboard under Pilot, against a fake daemon speaking the real protocol on a real socket."""

from __future__ import annotations

import pytest
from conftest import make_app, wait_until
from fake_daemon import FakeDaemon
from fake_data import idle_status, paused_status, training_status
from textual.command import CommandList
from textual.widgets import Label

from p2ptrain.protocol import ControlClient
from p2ptrain.tui.messages import DaemonPushed, HistoryLoaded
from p2ptrain.tui.widgets.event_log import EventLog
from p2ptrain.tui.widgets.hardware_panel import HardwarePanel
from p2ptrain.tui.widgets.peers_table import PeersTable
from p2ptrain.tui.widgets.status_header import StatusHeader
from p2ptrain.tui.widgets.swarm_panel import SwarmPanel

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]


def plain_text(widget) -> str:
    """What a Static or Label shows, without its markup."""
    return widget.render().plain


def label_text(app, selector: str) -> str:
    return plain_text(app.screen_stack[0].query_one(selector, Label))


def first_command(app) -> str:
    """The command the palette's Enter would run now (its first hit), or "" while it has none."""
    hits = app.screen.query_one(CommandList)
    return str(hits.get_option_at_index(0).prompt) if hits.option_count else ""


def notifications(app) -> list[str]:
    return [notification.message for notification in app._notifications]


async def test_dashboard_shows_state_peers_history_and_gpu(daemon):
    app = make_app(daemon.paths.home)
    async with app.run_test(size=(200, 60)) as pilot:
        await wait_until(pilot, lambda: app.view is not None and app.view.events, what="the history")
        await pilot.pause(0.1)
        assert "TRAINING" in label_text(app, "#state")
        details = label_text(app, "#details")
        assert "tiny-demo" in details and "amber-fox" in details and "up 1d 02h" in details
        assert "Epoch 42" in label_text(app, "#swarm-epoch")
        facts = label_text(app, "#swarm-facts")
        assert "next epoch in 31s" in facts and "3 peers" in facts and "last averaging 5m 00s ago" in facts
        table = app.query_one(PeersTable)
        assert table.row_count == 3
        rows = [table.get_row_at(index) for index in range(3)]
        assert rows[0][0] == "★ amber-fox"
        assert any("incompatible" in row[0] and row[0].startswith("red-crane") for row in rows)
        assert any(row[4] == "relayed" for row in rows)
        hardware = plain_text(app.query_one(HardwarePanel))
        assert "RTX 3060" in hardware and "162/170 W" in hardware and "fan" in hardware
        log = app.query_one(EventLog)
        assert len(log.lines) == len(daemon.events)
        assert app.query_one(SwarmPanel).last_averaging == daemon.epochs[-1]["ended_at"]
    assert set(daemon.methods_called()) == {"subscribe", "peers", "metrics", "epochs", "events"}


async def test_first_the_status_then_the_history_fetched_once(daemon):
    messages = []

    def keep(message) -> None:
        if isinstance(message, (DaemonPushed, HistoryLoaded)):
            messages.append(message)

    app = make_app(daemon.paths.home)
    async with app.run_test(message_hook=keep) as pilot:
        await wait_until(pilot, lambda: len(messages) >= 2, what="the status and the history")
        await pilot.pause(1.0)
    first, second = messages[:2]
    assert isinstance(first, DaemonPushed) and (first.event, first.data.state) == ("snapshot", "training")
    assert isinstance(second, HistoryLoaded)
    assert len(second.history.events) == len(daemon.events) and len(second.history.steps) == len(daemon.steps)
    # One subscription, the history once, and nothing polled: no status request at all.
    assert sorted(daemon.methods_called()) == ["epochs", "events", "metrics", "peers", "subscribe"]
    assert daemon.requests_for("metrics")[0]["params"] == {"run_id": "tiny-demo", "limit": 2000}


async def test_p_pauses_at_once_without_a_dialog(daemon):
    app = make_app(daemon.paths.home)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: app.state == "training", what="training")
        await pilot.press("p")
        await wait_until(pilot, lambda: app.state == "paused", what="the paused state")
        assert len(app.screen_stack) == 1, "no dialog"
        assert daemon.requests_for("pause")[0]["params"] == {}
        assert "paused by you · press p to resume" in label_text(app, "#reason")


async def test_t_asks_how_long_and_sends_the_duration(daemon):
    app = make_app(daemon.paths.home)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: app.state == "training", what="training")
        await pilot.press("t")
        await wait_until(pilot, lambda: app.screen.query("#pause-duration"), what="the pause dialog")
        await pilot.press(*"1h30m", "enter")
        await wait_until(pilot, lambda: app.state == "paused", what="the paused state")
        assert daemon.requests_for("pause")[0]["params"] == {"for_s": 5400.0}
        assert "paused by you · resumes in 1h 30m" in label_text(app, "#reason")
        assert any("Paused for 1h 30m" in text for text in notifications(app))


async def test_the_command_palette_offers_the_timed_pause(daemon):
    app = make_app(daemon.paths.home)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: app.state == "training", what="training")
        await pilot.press("ctrl+p")
        await wait_until(pilot, lambda: type(app.screen).__name__ == "CommandPalette", what="the command palette")
        await pilot.press(*"pause for a while")
        await wait_until(pilot, lambda: first_command(app).startswith("Pause for a while"), what="the command found")
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.screen.query("#pause-duration"), what="the pause dialog")
        await pilot.press(*"45m", "enter")
        await wait_until(pilot, lambda: app.state == "paused", what="the paused state")
        assert daemon.requests_for("pause")[0]["params"] == {"for_s": 2700.0}


@pytest.mark.parametrize(("text", "says"), [("soon", "'soon' is not a duration; use e.g. 90s"), ("90", "'90' has no unit"),
                                            ("", "'' is not a duration")])
async def test_timed_pause_refuses_what_is_not_a_duration(daemon, text, says):
    app = make_app(daemon.paths.home)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: app.state == "training", what="training")
        await pilot.press("t")
        await wait_until(pilot, lambda: app.screen.query("#pause-duration"), what="the pause dialog")
        await pilot.press(*text, "enter")
        await pilot.pause(0.1)
        assert says in plain_text(app.screen.query_one("#pause-error", Label))
        assert daemon.requests_for("pause") == []


async def test_p_resumes_when_paused(tmp_path):
    with FakeDaemon(tmp_path / "home", paused_status("temperature")) as daemon:
        app = make_app(daemon.paths.home)
        async with app.run_test() as pilot:
            await wait_until(pilot, lambda: app.state == "paused", what="paused")
            assert "the GPU is too hot" in label_text(app, "#reason")
            await pilot.press("p")
            await wait_until(pilot, lambda: app.state == "training", what="training again")
        assert len(daemon.requests_for("resume")) == 1


async def test_a_machine_without_a_gpu_shows_its_cpu_as_the_daemon_describes_it(tmp_path):
    status = training_status()
    status["hardware"]["gpus"] = []  # the daemon's hardware.cpu: model, cores_physical, cores_logical
    with FakeDaemon(tmp_path / "home", status) as daemon:
        app = make_app(daemon.paths.home)
        async with app.run_test(size=(200, 60)) as pilot:
            await wait_until(pilot, lambda: app.state == "training", what="training")
            await pilot.pause(0.1)
            hardware = plain_text(app.query_one(HardwarePanel))
            assert "no NVIDIA GPU · AMD Ryzen 5 5600X (6 cores, 12 threads)" in hardware, hardware


async def test_leave_asks_first_and_cancel_sends_nothing(daemon):
    app = make_app(daemon.paths.home)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: app.state == "training", what="training")
        await pilot.press("l")
        await wait_until(pilot, lambda: app.screen.query("#confirm-yes"), what="the confirmation")
        await pilot.press("escape")
        await pilot.pause(0.3)
        assert daemon.requests_for("leave") == []
        await pilot.press("l")
        await wait_until(pilot, lambda: app.screen.query("#confirm-yes"), what="the confirmation")
        await pilot.click("#confirm-yes")
        await wait_until(pilot, lambda: app.state == "idle", what="idle after leaving")
        assert len(daemon.requests_for("leave")) == 1
        assert "press j to join" in label_text(app, "#reason")


async def test_join_dialog_sends_run_and_bootstrap_address(tmp_path):
    with FakeDaemon(tmp_path / "home", idle_status()) as daemon:
        app = make_app(daemon.paths.home)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_until(pilot, lambda: app.state == "idle", what="idle")
            await pilot.press("j")
            await wait_until(pilot, lambda: app.screen.query("#join-run"), what="the join dialog")
            await pilot.press(*"wiki-lora")
            app.screen.query_one("#join-bootstrap").focus()
            await pilot.press(*"/ip4/127.0.0.1/tcp/31337/p2p/12D3KooWBoot")
            await pilot.click("#join-confirm")
            await wait_until(pilot, lambda: app.state == "joining", what="joining")
        assert daemon.requests_for("join")[0]["params"] == {
            "run": "wiki-lora",
            "initial_peers": ["/ip4/127.0.0.1/tcp/31337/p2p/12D3KooWBoot"],
        }


async def test_join_dialog_starts_a_new_run_with_mode_and_model(tmp_path):
    with FakeDaemon(tmp_path / "home", idle_status()) as daemon:
        app = make_app(daemon.paths.home)
        async with app.run_test(size=(100, 40)) as pilot:
            await wait_until(pilot, lambda: app.state == "idle", what="idle")
            await pilot.press("j")
            await wait_until(pilot, lambda: app.screen.query("#join-run"), what="the join dialog")
            await pilot.press(*"my-run")
            await pilot.click("#join-new-run")
            app.screen.query_one("#join-mode").value = "diloco"
            await pilot.click("#join-confirm")
            await wait_until(pilot, lambda: daemon.requests_for("join"), what="the join request")
        params = daemon.requests_for("join")[0]["params"]
        assert params == {"run": "my-run", "initial_peers": [], "new_run": True,
                          "manifest": {"mode": "diloco", "model": "tiny"}}


async def test_refused_action_shows_the_daemons_error_and_fix(tmp_path):
    with FakeDaemon(tmp_path / "home", paused_status("user")) as daemon:
        app = make_app(daemon.paths.home)
        async with app.run_test() as pilot:
            await wait_until(pilot, lambda: app.state == "paused", what="paused")
            await pilot.press("f")
            await wait_until(pilot, lambda: notifications(app), what="a notification")
        assert daemon.requests_for("finish")
        assert notifications(app) == ["finish refused: already paused (resume first: p2ptrain resume)"]


async def test_help_lists_every_key(daemon):
    app = make_app(daemon.paths.home)
    async with app.run_test(size=(100, 40)) as pilot:
        await wait_until(pilot, lambda: app.state == "training", what="training")
        await pilot.press("question_mark")
        await wait_until(pilot, lambda: app.screen.query("#help-dialog"), what="the help screen")
        assert type(app.screen).__name__ == "HelpScreen"
        await pilot.press("escape")
        await wait_until(pilot, lambda: len(app.screen_stack) == 1, what="help closed")


async def test_quit_leaves_the_daemon_running(daemon):
    app = make_app(daemon.paths.home)
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: app.state == "training", what="training")
        await pilot.press("q")
        await wait_until(pilot, lambda: not app.is_running, what="the app to exit")
    # Only reads: quitting sends no control verb (pause, leave...).
    assert set(daemon.methods_called()) <= {"peers", "metrics", "epochs", "events", "subscribe"}
    assert ControlClient(str(daemon.socket_path)).call("status")["state"] == "training"


async def test_state_change_in_the_daemon_reaches_the_screen(daemon):
    app = make_app(daemon.paths.home)
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: app.state == "training", what="training")
        daemon.set_status(paused_status("battery"))
        await wait_until(pilot, lambda: app.state == "paused", what="the battery pause")
        assert "running on battery" in label_text(app, "#reason")
        assert app.query_one(StatusHeader).has_class("-paused")
        daemon.set_status(training_status())
        await wait_until(pilot, lambda: app.state == "training", what="training again")


async def test_i_shows_the_hardware_plan_and_why(daemon):
    from p2ptrain.tui.screens.plan_screen import PlanScreen

    app = make_app(daemon.paths.home)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.view is not None and app.view.status.local, what="the status")
        await pilot.pause(0.1)
        assert "plan: ~0.7 of 20.2 GiB allowed · i why" in plain_text(app.query_one(HardwarePanel))
        await pilot.press("i")
        await wait_until(pilot, lambda: isinstance(app.screen, PlanScreen), what="the plan screen")
        shown = plain_text(app.screen.query_one("#plan-dialog Static"))
        assert "bf16, micro-batch 8 x 4" in shown and "allocator capped at 19.71 GiB" in shown
        assert "• precision bf16: compute capability 8.9 supports bfloat16" in shown
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, PlanScreen), what="the plan screen to close")
