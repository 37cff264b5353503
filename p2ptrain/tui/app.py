"""``p2ptrain-tui``: the dashboard a volunteer leaves open all day.

A thin client of the daemon's control socket, fed by what the daemon pushes:
a thread worker follows its ``subscribe`` stream (``feed.DaemonFeed``: the
history once, then each update) and posts what it got as messages; the app
keeps it in a ``DaemonView`` and redraws only the parts updates changed, once
a second with the ages on screen (a training daemon pushes a step and a status
every second), or at once when the state changes. Quitting leaves the daemon
running.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from textual import work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Grid
from textual.screen import Screen
from textual.widgets import ContentSwitcher, Footer

from p2ptrain.control_types import Push, Status
from p2ptrain.protocol import ControlClient, DaemonError, DaemonNotRunning
from p2ptrain.tui.connection import DaemonTarget, find_daemon, start_daemon
from p2ptrain.tui.daemon_view import EPOCHS, EVENTS, PEERS, STATUS, STEPS, DaemonView
from p2ptrain.tui.feed import RETRY_DELAYS_S, DaemonFeed
from p2ptrain.tui.formatting import format_duration
from p2ptrain.tui.messages import ActionFinished, DaemonPushed, DaemonUnreachable, HistoryLoaded
from p2ptrain.tui.screens.confirm_dialog import ConfirmDialog
from p2ptrain.tui.screens.join_dialog import JoinDialog
from p2ptrain.tui.screens.pause_dialog import PauseDialog
from p2ptrain.tui.widgets.chart_slot import ChartSlot
from p2ptrain.tui.widgets.event_log import EventLog
from p2ptrain.tui.widgets.hardware_panel import HardwarePanel
from p2ptrain.tui.widgets.peers_table import PeersTable
from p2ptrain.tui.widgets.status_header import StatusHeader
from p2ptrain.tui.widgets.swarm_panel import SwarmPanel
from p2ptrain.tui.widgets.unreachable_panel import UnreachablePanel

ACTIVE_STATES = ("joining", "training", "paused", "finishing", "leaving")
# Seconds between redraws of what was pushed meanwhile, and of the ages on screen ("up 2h 05m").
REDRAW_EVERY_S = 1.0


class P2PTrainApp(App):
    """The p2ptrain dashboard.

    Args:
        target: the daemon to show (see :func:`p2ptrain.tui.connection.find_daemon`).
        clock: returns the current time as a Unix timestamp; tests pass a frozen
            one so that ages and uptimes are the same in every snapshot.
        request_timeout_s: seconds to wait for each reply.
        daemon_command: the ``p2ptrain`` executable as an argument list, for
            the "start a user daemon" button.
        theme_name: a Textual theme, e.g. ``textual-dark`` or ``textual-light``.
        retry_delays_s: seconds between attempts while no daemon answers, one
            per consecutive failure; the last one repeats.
    """

    CSS_PATH = Path(__file__).with_name("app.tcss")
    # Focusing the peers table on start would scroll a narrow dashboard past the swarm panel.
    AUTO_FOCUS = None
    TITLE = "p2ptrain"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]
    BINDINGS = [
        Binding("j", "join", "Join"),
        # One key, its label following the state: "Pause" while training, "Resume" while paused.
        Binding("p", "pause", "Pause"),
        Binding("p", "resume", "Resume"),
        Binding("t", "timed_pause", "Pause for…"),
        Binding("f", "finish", "Finish"),
        Binding("l", "leave", "Leave"),
        Binding("i", "plan", "Plan"),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(
        self,
        target: DaemonTarget,
        clock: Callable[[], float] = time.time,
        request_timeout_s: float = 3.0,
        daemon_command: list[str] | None = None,
        theme_name: str = "textual-dark",
        retry_delays_s: tuple[float, ...] = RETRY_DELAYS_S,
    ) -> None:
        super().__init__()
        self.target = target
        self.clock = clock
        self.request_timeout_s = request_timeout_s
        self.daemon_command = daemon_command
        self.theme = theme_name
        self.view: DaemonView | None = None
        self.started_daemon = None
        self.feed = DaemonFeed(target.socket, self.post_message, request_timeout_s, retry_delays_s)
        self._charts_requested = False
        self._changed: set[str] = set()  # parts of the view changed since the last redraw
        # What each part of the view shows in (see DaemonView.apply).
        self._show_part = {
            STATUS: self._show_status,
            PEERS: self._show_peers,
            STEPS: self._show_steps,
            EPOCHS: self._show_epochs,
            EVENTS: self._show_events,
        }

    def compose(self) -> ComposeResult:
        yield StatusHeader(id="status-header")
        # Nothing below the header until the daemon answered: the first full frame then shows live state.
        with ContentSwitcher(initial=None, id="body"):
            with Grid(id="dashboard"):
                yield SwarmPanel(id="swarm")
                yield HardwarePanel(id="hardware")
                yield PeersTable(id="peers")
                yield ChartSlot("Loss", id="loss-chart")
                yield ChartSlot("Epoch durations", id="epoch-chart")
                yield EventLog(id="events")
            yield UnreachablePanel(
                str(self.target.socket), self.target.start_command, self.target.can_start, id="unreachable"
            )
        yield Footer()

    def on_mount(self) -> None:
        self.follow_daemon()
        self.set_interval(REDRAW_EVERY_S, self._redraw)

    def on_unmount(self) -> None:
        self.feed.stop()

    @work(thread=True, exclusive=True, group="feed")
    def follow_daemon(self) -> None:
        """Follow the daemon until the app exits (``on_unmount`` stops the feed)."""
        self.feed.run()

    @property
    def _exiting(self) -> bool:
        # A message from the feed can arrive while the app tears its screen down on quit
        # (or, under the test driver, shuts down without a quit: not running any more).
        return self._exit or not self.is_running or not self.screen_stack

    def _dashboard(self, selector: str | type):
        """A widget of the dashboard screen, even while a dialog is open above it."""
        return self.screen_stack[0].query_one(selector)

    @property
    def state(self) -> str | None:
        """The daemon's state as last pushed (None while it is unreachable)."""
        return self.view.status.state if self.view else None

    def _client(self) -> ControlClient:
        return ControlClient(str(self.target.socket), timeout=self.request_timeout_s)

    # ----- what the feed posts -----------------------------------------------------

    def on_daemon_pushed(self, message: DaemonPushed) -> None:
        if self._exiting:
            return
        if self.view is None:
            if message.event not in (Push.SNAPSHOT, Push.STATUS) or not isinstance(message.data, Status):
                return
            self.view = DaemonView(message.data)
            self._changed.update(self._show_part)
            self._redraw()
            self._dashboard(ContentSwitcher).current = "dashboard"
            self._load_charts_after_this_frame()
            return
        shown = self._dashboard(StatusHeader).status
        shown_state = shown.state if shown else None
        self._changed.update(self.view.apply(message.event, message.data))
        if self.state != shown_state:
            self._redraw()  # a pause, a resume, an error: at once

    def on_history_loaded(self, message: HistoryLoaded) -> None:
        if self._exiting or self.view is None:
            return
        self._changed.update(self.view.load(message.history))
        self._redraw()

    def on_daemon_unreachable(self, message: DaemonUnreachable) -> None:
        if self._exiting:
            return
        self.view = None
        self.refresh_bindings()
        self._dashboard(StatusHeader).status = None
        self._dashboard(StatusHeader).connection = f"{message.reason} · retrying in {message.retry_in_s:g}s"
        panel = self._dashboard(UnreachablePanel)
        panel.reason = message.reason
        panel.retry_in_s = message.retry_in_s
        self._dashboard(ContentSwitcher).current = "unreachable"
        self._load_charts_after_this_frame()

    # ----- showing the view ---------------------------------------------------------

    def _redraw(self) -> None:
        """Show the parts changed since the last redraw, and the ages as of now."""
        if self._exiting or self.view is None:
            return
        changed, self._changed = self._changed, set()
        for part in changed:
            self._show_part[part]()
        now = self.clock()
        for widget in (StatusHeader, SwarmPanel, PeersTable):
            self._dashboard(widget).now = now

    def _show_status(self) -> None:
        status = self.view.status
        header = self._dashboard(StatusHeader)
        if (header.status.state if header.status else None) != status.state:
            self.refresh_bindings()  # p: Pause or Resume
        header.status = status
        self._dashboard(SwarmPanel).run = status.run
        hardware = self._dashboard(HardwarePanel)
        hardware.local = status.local
        hardware.hardware = status.hardware

    def _show_peers(self) -> None:
        self._dashboard(PeersTable).peers = self.view.peers

    def _show_steps(self) -> None:
        loss = self._dashboard("#loss-chart").chart
        if loss is not None:
            loss.steps = tuple(self.view.steps)

    def _show_epochs(self) -> None:
        self._dashboard(SwarmPanel).last_averaging = self.view.last_averaging
        epochs = tuple(self.view.epochs)
        loss = self._dashboard("#loss-chart").chart
        if loss is not None:
            loss.epochs = epochs
        durations = self._dashboard("#epoch-chart").chart
        if durations is not None:
            durations.epochs = epochs

    def _show_events(self) -> None:
        self._dashboard(EventLog).events = tuple(self.view.events)

    @property
    def charts_ready(self) -> bool:
        """True once the loss and epoch charts are mounted (shortly after the first frame)."""
        return all(self._dashboard(slot).chart is not None for slot in ("#loss-chart", "#epoch-chart"))

    def _load_charts_after_this_frame(self) -> None:
        if not self._charts_requested:
            self._charts_requested = True
            self.call_after_refresh(self.mount_charts)

    @work(exclusive=True, group="charts")
    async def mount_charts(self) -> None:
        """Put the loss and epoch charts into their slots.

        Called once the first answer of the daemon (or its absence) is on screen:
        importing textual-plotext takes about a tenth of a second, which the
        first frame should not wait for. The import runs in a thread, so the
        dashboard keeps updating meanwhile.
        """
        loss_chart_class, epoch_chart_class = await asyncio.to_thread(_import_charts)
        if self._exiting:
            return
        loss_chart, epoch_chart = loss_chart_class(), epoch_chart_class()
        if self.view is not None:
            # Their data before they are mounted: each draws once, with it.
            loss_chart.steps = tuple(self.view.steps)
            loss_chart.epochs = epoch_chart.epochs = tuple(self.view.epochs)
        await self._dashboard("#loss-chart").mount(loss_chart)
        await self._dashboard("#epoch-chart").mount(epoch_chart)
        if self.view is not None and not self._exiting:
            # The history may have arrived while they were being mounted, when there was no chart to show it in.
            self._show_steps()
            self._show_epochs()

    # ----- what the user does -------------------------------------------------------

    def on_unreachable_panel_start_requested(self) -> None:
        try:
            self.started_daemon = start_daemon(self.target, self.daemon_command)
        except OSError as error:
            self.notify(f"Could not start the daemon: {error}", severity="error")
            return
        log = self.target.paths.log_dir / "daemon-start.log"
        self.notify(f"Started the daemon (pid {self.started_daemon.pid}); its output goes to {log}")
        self.feed.retry_now()

    @work(thread=True, group="actions")
    def call_daemon(self, method: str, params: dict[str, Any], done: str) -> None:
        """Send one control request and report its outcome; the daemon pushes the change it makes.

        Args:
            method: the protocol method (``pause``, ``join``, ...).
            params: its params.
            done: what to tell the user when it succeeded.
        """
        try:
            self._client().call(method, **params)
        except DaemonNotRunning as error:
            self.post_message(ActionFinished(method, error.one_line(self.target.start_command), failed=True))
        except DaemonError as error:
            self.post_message(ActionFinished(method, f"{method} refused: {error.one_line()}", failed=True))
        except (OSError, ValueError) as error:
            self.post_message(ActionFinished(method, f"{method} failed: {error}", failed=True))
        else:
            self.post_message(ActionFinished(method, done, failed=False))

    def on_action_finished(self, message: ActionFinished) -> None:
        self.notify(message.outcome, severity="error" if message.failed else "information", markup=False)

    def _in_a_run(self, verb: str) -> bool:
        """True when the daemon is in a run; otherwise says so (nothing to ``verb``)."""
        if self.state in ACTIVE_STATES:
            return True
        self.notify(f"Nothing to {verb}: not in a run (press j to join one)", severity="warning")
        return False

    def action_join(self) -> None:
        if self.state in ACTIVE_STATES:
            run = self.view.run_id or "a run"
            self.notify(f"Already in {run}: press l to leave it first", severity="warning")
            return

        def join(params: dict | None) -> None:
            if params is not None:
                self.call_daemon("join", params, f"Joining {params['run']}…")

        self.push_screen(JoinDialog(), join)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """``p`` pauses unless paused, and resumes while paused (the footer shows the one that applies)."""
        if action == "pause":
            return self.state != "paused"
        if action == "resume":
            return self.state == "paused"
        return True

    def action_pause(self) -> None:
        """``p``: pause at once, until resumed."""
        if self._in_a_run("pause"):
            self.call_daemon("pause", {}, "Paused until you resume (p)")

    def action_resume(self) -> None:
        if self._in_a_run("resume"):
            self.call_daemon("resume", {}, "Resumed training")

    def action_timed_pause(self) -> None:
        """``t``: ask how long, then pause for that long (the daemon resumes by itself)."""
        if not self._in_a_run("pause"):
            return

        def pause(params: dict | None) -> None:
            if params is not None:
                self.call_daemon("pause", params, f"Paused for {format_duration(params['for_s'])}")

        self.push_screen(PauseDialog(), pause)

    def action_finish(self) -> None:
        self.call_daemon("finish", {}, "Finishing the current epoch, then pausing")

    def action_leave(self) -> None:
        run = (self.view.run_id if self.view else None) or "the run"

        def leave(confirmed: bool | None) -> None:
            if confirmed:
                self.call_daemon("leave", {}, f"Leaving {run}: checkpointing and saying goodbye")

        self.push_screen(ConfirmDialog(f"Leave {run}? Training stops until you join again.", "Leave"), leave)

    def action_plan(self) -> None:
        """The hardware plan of each worker, with the reason for each choice."""
        from p2ptrain.tui.screens.plan_screen import PlanScreen

        local = self.view.status.local if self.view else None
        self.push_screen(PlanScreen(local.workers if local else []))

    def action_help(self) -> None:
        # The help's Markdown widget imports markdown-it and pygments: only when asked for.
        from p2ptrain.tui.screens.help_screen import HelpScreen

        self.push_screen(HelpScreen())

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """The command palette (ctrl+p): Textual's commands, then the daemon's verbs."""
        yield from super().get_system_commands(screen)
        yield SystemCommand("Pause", "Stop training until you resume (p)", self.action_pause)
        yield SystemCommand("Pause for a while", "Stop training for e.g. 2h; it resumes by itself (t)", self.action_timed_pause)
        yield SystemCommand("Resume", "Go on training (p while paused)", self.action_resume)
        yield SystemCommand("Finish the epoch", "Complete the current epoch, then pause (f)", self.action_finish)
        yield SystemCommand("Leave the run", "Checkpoint and leave; asks first (l)", self.action_leave)
        yield SystemCommand("Join a run", "Join a run or start a new one (j)", self.action_join)
        yield SystemCommand("Hardware plan", "What this machine trains with, and why (i)", self.action_plan)


def _import_charts() -> tuple[type, type]:
    """The chart widget classes; importing them imports textual-plotext and plotext."""
    from p2ptrain.tui.widgets.epoch_chart import EpochChart
    from p2ptrain.tui.widgets.loss_chart import LossChart

    return LossChart, EpochChart


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``p2ptrain tui`` (the CLI adds ``--home``) and of ``p2ptrain-tui``."""
    parser.add_argument(
        "--theme", default="textual-dark", help="a Textual theme, e.g. textual-dark (default) or textual-light"
    )


def run(args: argparse.Namespace) -> int:
    """Run the TUI on the daemon of ``args.home`` until the user quits; the daemon keeps running."""
    app = P2PTrainApp(find_daemon(args.home))
    if args.theme not in app.available_themes:
        print(
            f"p2ptrain-tui: unknown theme {args.theme!r}; choose one of: {', '.join(sorted(app.available_themes))}",
            file=sys.stderr,
        )
        return 2
    app.theme = args.theme
    app.run()
    return 0


def main(argv: list[str] | None = None) -> int:
    """``p2ptrain-tui [--home DIR] [--theme NAME]``, the same as ``p2ptrain tui``."""
    parser = argparse.ArgumentParser(
        prog="p2ptrain-tui", description="Watch and control the p2ptrain daemon on this machine."
    )
    parser.add_argument("--home", help="the daemon's directory (as given to `p2ptrain daemon --home`)")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
