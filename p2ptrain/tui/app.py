"""``p2ptrain-tui``: the dashboard a volunteer leaves open all day.

A thin client of the daemon's control socket: a thread worker polls the
daemon (never two polls at once) and posts what it got as a message; the
widgets only show what the message carries. A second worker follows the
daemon's ``subscribe`` stream and starts a poll at once when it pushes a
change. Quitting leaves the daemon running.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Grid
from textual.widgets import ContentSwitcher, Footer
from textual.worker import get_current_worker

from p2ptrain.protocol import ControlClient, DaemonError, DaemonNotRunning
from p2ptrain.tui.changes import follow_changes
from p2ptrain.tui.connection import DaemonTarget, find_daemon, start_daemon
from p2ptrain.tui.formatting import format_duration
from p2ptrain.tui.messages import ActionFinished, DaemonUnreachable, DaemonUpdated
from p2ptrain.tui.screens.confirm_dialog import ConfirmDialog
from p2ptrain.tui.screens.join_dialog import JoinDialog
from p2ptrain.tui.screens.pause_dialog import PauseDialog
from p2ptrain.tui.snapshot import DaemonSnapshot, History, fetch_snapshot
from p2ptrain.tui.widgets.chart_slot import ChartSlot
from p2ptrain.tui.widgets.event_log import EventLog
from p2ptrain.tui.widgets.hardware_panel import HardwarePanel
from p2ptrain.tui.widgets.peers_table import PeersTable
from p2ptrain.tui.widgets.status_header import StatusHeader
from p2ptrain.tui.widgets.swarm_panel import SwarmPanel
from p2ptrain.tui.widgets.unreachable_panel import UnreachablePanel

# Seconds between attempts while no daemon answers: quick at first (it may be
# starting), then gentle on a machine where it is simply not running.
RETRY_DELAYS_S = (0.5, 1.0, 2.0, 4.0, 5.0)
ACTIVE_STATES = ("joining", "training", "paused", "finishing", "leaving")


class P2PTrainApp(App):
    """The p2ptrain dashboard.

    Args:
        target: the daemon to show (see :func:`p2ptrain.tui.connection.find_daemon`).
        clock: returns the current time as a Unix timestamp; tests pass a frozen
            one so that ages and uptimes are the same in every snapshot.
        poll_interval_s: seconds between polls while the daemon answers.
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
        Binding("p", "pause_or_resume", "Pause/Resume"),
        Binding("f", "finish", "Finish"),
        Binding("l", "leave", "Leave"),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(
        self,
        target: DaemonTarget,
        clock: Callable[[], float] = time.time,
        poll_interval_s: float = 1.0,
        request_timeout_s: float = 3.0,
        daemon_command: list[str] | None = None,
        theme_name: str = "textual-dark",
        retry_delays_s: tuple[float, ...] = RETRY_DELAYS_S,
    ) -> None:
        super().__init__()
        self.target = target
        self.clock = clock
        self.poll_interval_s = poll_interval_s
        self.request_timeout_s = request_timeout_s
        self.daemon_command = daemon_command
        self.retry_delays_s = retry_delays_s
        self.theme = theme_name
        self.snapshot: DaemonSnapshot | None = None
        self.started_daemon = None
        self._poll_now = threading.Event()
        self._charts_requested = False

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
        self.poll_daemon()
        self.follow_daemon_changes()

    @property
    def _exiting(self) -> bool:
        # A poll's message can arrive while the app tears its screen down on quit
        # (or, under the test driver, shuts down without a quit: not running any more).
        return self._exit or not self.is_running or not self.screen_stack

    def _dashboard(self, selector: str | type):
        """A widget of the dashboard screen, even while a dialog is open above it."""
        return self.screen_stack[0].query_one(selector)

    @property
    def state(self) -> str | None:
        """The daemon's state as of the last poll (None before one succeeded)."""
        return self.snapshot.status.get("state") if self.snapshot else None

    def _client(self) -> ControlClient:
        return ControlClient(str(self.target.socket), timeout=self.request_timeout_s)

    @work(thread=True, exclusive=True, group="poll")
    def poll_daemon(self) -> None:
        """Poll until the app exits; the next poll starts only after this one ended."""
        worker = get_current_worker()
        client = self._client()
        history = History()
        failures = 0
        answered = False
        while not worker.is_cancelled:
            delay = self.poll_interval_s
            try:
                # Until the daemon first answered, the status alone: the first frame shows it
                # three round trips sooner, and the history follows at once.
                snapshot = fetch_snapshot(client, history, with_history=answered)
            except DaemonNotRunning:
                delay = self.retry_delays_s[min(failures, len(self.retry_delays_s) - 1)]
                failures += 1
                self.post_message(DaemonUnreachable("nothing listens on the control socket", delay))
            except DaemonError as error:
                delay = self.retry_delays_s[-1]
                self.post_message(DaemonUnreachable(error.one_line(), delay))
            except (OSError, ValueError) as error:
                # A timeout, a reset connection or a garbled reply: the daemon is there but unwell.
                delay = self.retry_delays_s[min(failures, len(self.retry_delays_s) - 1)]
                failures += 1
                self.post_message(DaemonUnreachable(f"the daemon did not answer properly: {error}", delay))
            else:
                failures = 0
                self.post_message(DaemonUpdated(snapshot))
                if not answered:
                    answered = True
                    continue
            self._wait_for_next_poll(worker, delay)

    @work(exclusive=True, group="changes")
    async def follow_daemon_changes(self) -> None:
        """Poll at once whenever the daemon pushes a change (its ``subscribe`` stream)."""
        await follow_changes(self.target.socket, self._poll_now.set)

    def _wait_for_next_poll(self, worker, delay: float) -> None:
        # Short waits so that quitting (worker cancelled) and actions (poll now) are noticed at once.
        deadline = time.monotonic() + delay
        while not worker.is_cancelled and time.monotonic() < deadline:
            if self._poll_now.wait(0.05):
                self._poll_now.clear()
                return

    def on_daemon_updated(self, message: DaemonUpdated) -> None:
        if self._exiting:
            return
        snapshot = message.snapshot
        self.snapshot = snapshot
        now = self.clock()
        status = snapshot.status
        header = self._dashboard(StatusHeader)
        header.status = status
        header.now = now
        swarm = self._dashboard(SwarmPanel)
        swarm.run = status.get("run")
        finished = [row for row in snapshot.epochs if row.get("ended_at")]
        swarm.last_averaging = finished[-1]["ended_at"] if finished else None
        swarm.now = now
        hardware = self._dashboard(HardwarePanel)
        hardware.local = status.get("local")
        hardware.hardware = status.get("hardware")
        peers = self._dashboard(PeersTable)
        peers.peers = snapshot.peers
        peers.now = now
        self._show_history_in_charts(snapshot)
        self._dashboard(EventLog).events = snapshot.events
        self._dashboard(ContentSwitcher).current = "dashboard"
        self._load_charts_after_this_frame()

    def on_daemon_unreachable(self, message: DaemonUnreachable) -> None:
        if self._exiting:
            return
        self.snapshot = None
        self._dashboard(StatusHeader).status = None
        self._dashboard(StatusHeader).connection = f"{message.reason} · retrying in {message.retry_in_s:g}s"
        panel = self._dashboard(UnreachablePanel)
        panel.reason = message.reason
        panel.retry_in_s = message.retry_in_s
        self._dashboard(ContentSwitcher).current = "unreachable"
        self._load_charts_after_this_frame()

    def _show_history_in_charts(self, snapshot: DaemonSnapshot) -> None:
        loss = self._dashboard("#loss-chart").chart
        if loss is not None:
            loss.steps = snapshot.steps
            loss.epochs = snapshot.epochs
        durations = self._dashboard("#epoch-chart").chart
        if durations is not None:
            durations.epochs = snapshot.epochs

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
        await self._dashboard("#loss-chart").mount(loss_chart_class())
        await self._dashboard("#epoch-chart").mount(epoch_chart_class())
        if self.snapshot is not None:
            self._show_history_in_charts(self.snapshot)

    def on_unreachable_panel_start_requested(self) -> None:
        try:
            self.started_daemon = start_daemon(self.target, self.daemon_command)
        except OSError as error:
            self.notify(f"Could not start the daemon: {error}", severity="error")
            return
        log = self.target.paths.log_dir / "daemon-start.log"
        self.notify(f"Started the daemon (pid {self.started_daemon.pid}); its output goes to {log}")
        self._poll_now.set()

    @work(thread=True, group="actions")
    def call_daemon(self, method: str, params: dict[str, Any], done: str) -> None:
        """Send one control request and report its outcome.

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
        self._poll_now.set()

    def on_action_finished(self, message: ActionFinished) -> None:
        self.notify(message.outcome, severity="error" if message.failed else "information", markup=False)

    def action_join(self) -> None:
        if self.state in ACTIVE_STATES:
            run = (self.snapshot.status.get("run") or {}).get("id", "a run")
            self.notify(f"Already in {run}: press l to leave it first", severity="warning")
            return

        def join(params: dict | None) -> None:
            if params is not None:
                self.call_daemon("join", params, f"Joining {params['run']}…")

        self.push_screen(JoinDialog(), join)

    def action_pause_or_resume(self) -> None:
        if self.state == "paused":
            self.call_daemon("resume", {}, "Resumed training")
            return
        if self.state not in ACTIVE_STATES:
            self.notify("Nothing to pause: not in a run (press j to join one)", severity="warning")
            return

        def pause(params: dict | None) -> None:
            if params is not None:
                until = f" for {format_duration(params['for_s'])}" if "for_s" in params else " until you resume (p)"
                self.call_daemon("pause", params, f"Paused{until}")

        self.push_screen(PauseDialog(), pause)

    def action_finish(self) -> None:
        self.call_daemon("finish", {}, "Finishing the current epoch, then pausing")

    def action_leave(self) -> None:
        run = ((self.snapshot.status.get("run") or {}).get("id") if self.snapshot else None) or "the run"

        def leave(confirmed: bool | None) -> None:
            if confirmed:
                self.call_daemon("leave", {}, f"Leaving {run}: checkpointing and saying goodbye")

        self.push_screen(ConfirmDialog(f"Leave {run}? Training stops until you join again.", "Leave"), leave)

    def action_help(self) -> None:
        # The help's Markdown widget imports markdown-it and pygments: only when asked for.
        from p2ptrain.tui.screens.help_screen import HelpScreen

        self.push_screen(HelpScreen())


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
