"""Shown instead of the dashboard while no daemon answers: why, and how to start one."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Center, Vertical
from textual.markup import escape
from textual.message import Message
from textual.reactive import reactive
from textual.widgets import Button, Label


class UnreachablePanel(Vertical):
    """The exact command that starts the daemon, and a button that does it for a user daemon.

    Args:
        socket: the control socket the TUI keeps trying.
        start_command: what a person types to start the daemon.
        can_start: offer the button (not for the system service, which systemd owns).
    """

    BORDER_TITLE = "Daemon unreachable"

    reason: reactive[str] = reactive("")
    retry_in_s: reactive[float] = reactive(0.0)

    class StartRequested(Message):
        """The user asked the TUI to start a user daemon."""

    def __init__(self, socket: str, start_command: str, can_start: bool, **kwargs) -> None:
        super().__init__(**kwargs)
        self.socket = socket
        self.start_command = start_command
        self.can_start = can_start

    def compose(self) -> ComposeResult:
        yield Label("[b]No p2ptrain daemon answers on[/b]", classes="unreachable-line")
        yield Label(escape(self.socket), id="unreachable-socket")
        yield Label("Start it in another terminal with:", classes="unreachable-line")
        yield Label(escape(self.start_command), id="unreachable-command")
        if self.can_start:
            with Center():
                yield Button("Start a user daemon", id="start-daemon", variant="primary")
        yield Label("", id="unreachable-reason")

    def _refresh_reason(self) -> None:
        retry = f"retrying in {self.retry_in_s:g}s" if self.retry_in_s else "retrying"
        self.query_one("#unreachable-reason", Label).update(f"{escape(self.reason)}\n{retry} · q quits")

    def on_mount(self) -> None:
        self._refresh_reason()

    def watch_reason(self) -> None:
        if self.is_mounted:
            self._refresh_reason()

    def watch_retry_in_s(self) -> None:
        if self.is_mounted:
            self._refresh_reason()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "start-daemon":
            event.stop()
            self.post_message(self.StartRequested())
