"""SVG snapshots of the screens a volunteer sees: training, paused, idle, error, unreachable.

The fake daemon serves fixed timestamps and the app's clock is frozen, so the
pictures are the same on every run. Update them after a deliberate change with
``pytest tests/tui --snapshot-update`` and look at the report.
"""

from __future__ import annotations

import pytest
from conftest import make_app, svg_difference, wait_until
from fake_daemon import FakeDaemon
from fake_data import error_status, idle_status, paused_status, sample_steps, training_status, two_gpus_status
from textual.widgets import ContentSwitcher

from p2ptrain.tui.widgets.epoch_chart import EpochChart
from p2ptrain.tui.widgets.loss_chart import LossChart

pytestmark = pytest.mark.timeout(120)

# Shown on the unreachable screen, so it must not be a per-test temporary directory.
ABSENT_HOME = "/nonexistent/p2ptrain-home"


def settled_on(state: str):
    """``run_before``: wait for the daemon's state, its history, the charts and the charts drawing the
    history, then for the app to go idle."""

    async def run_before(pilot) -> None:
        app = pilot.app
        await wait_until(pilot, lambda: app.state == state, what=state)
        await wait_until(pilot, lambda: app.view.events, what="the history")
        await wait_until(pilot, lambda: app.charts_ready, what="the charts")
        loss, durations = app.screen_stack[0].query_one(LossChart), app.screen_stack[0].query_one(EpochChart)

        def charts_show_the_view() -> bool:
            view = app.view
            epochs = tuple(view.epochs)
            return (loss.steps, loss.epochs, durations.epochs) == (tuple(view.steps), epochs, epochs) and not loss.redraw_pending

        await wait_until(pilot, charts_show_the_view, what="the charts drawing the history")
        await pilot.pause(0.3)

    return run_before


@pytest.mark.parametrize(
    ("status", "state", "size", "theme"),
    [
        (training_status, "training", (80, 24), "textual-dark"),
        (training_status, "training", (200, 60), "textual-dark"),
        (training_status, "training", (200, 60), "textual-light"),
        (lambda: paused_status("battery"), "paused", (80, 24), "textual-dark"),
        (lambda: paused_status("user", paused_until=1_767_000_000.0 + 5400), "paused", (200, 60), "textual-light"),
        (idle_status, "idle", (80, 24), "textual-dark"),
        (error_status, "error", (80, 24), "textual-light"),
    ],
    ids=["training-80x24-dark", "training-200x60-dark", "training-200x60-light", "paused-battery-80x24-dark",
         "paused-timed-200x60-light", "idle-80x24-dark", "error-80x24-light"],
)
def test_dashboard_snapshot(snap_compare, request, tmp_path, status, state, size, theme):
    with FakeDaemon(tmp_path / "home", status()) as daemon:
        app = make_app(daemon.paths.home, theme_name=theme)
        assert snap_compare(app, terminal_size=size, run_before=settled_on(state)), svg_difference(request)


def test_two_gpus_draw_a_loss_line_each(snap_compare, request, tmp_path):
    with FakeDaemon(tmp_path / "home", two_gpus_status(), steps=sample_steps(("gpu0", "gpu1"))) as daemon:
        app = make_app(daemon.paths.home, theme_name="textual-dark")
        assert snap_compare(app, terminal_size=(200, 60), run_before=settled_on("training")), svg_difference(request)


@pytest.mark.parametrize(("size", "theme"), [((80, 24), "textual-dark"), ((200, 60), "textual-light")])
def test_unreachable_snapshot(snap_compare, size, theme):
    app = make_app(ABSENT_HOME, theme_name=theme, retry_delays_s=(5.0,))

    async def run_before(pilot) -> None:
        switcher = pilot.app.screen_stack[0].query_one(ContentSwitcher)
        await wait_until(pilot, lambda: switcher.current == "unreachable", what="the unreachable panel")
        await pilot.pause(0.3)

    assert snap_compare(app, terminal_size=size, run_before=run_before)
