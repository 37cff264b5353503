"""Pause training for a while: the daemon resumes by itself when the time is up."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Input, Label

from p2ptrain.durations import ACCEPTED_FORMS, parse_duration
from p2ptrain.tui.screens.form_dialog import FormDialog


class PauseDialog(FormDialog):
    """Dismisses with the ``pause`` params (``{"for_s": seconds}``), or None when cancelled."""

    AUTO_FOCUS = "#pause-duration"
    CONFIRM_ID, ERROR_ID = "pause-confirm", "pause-error"

    def compose(self) -> ComposeResult:
        with Vertical(id="pause-dialog", classes="dialog"):
            yield Label("[b]Pause training for a while[/b]")
            yield Label(f"For how long? (e.g. {ACCEPTED_FORMS}); training resumes by itself")
            yield Input(placeholder="2h", id="pause-duration")
            yield Label("", id="pause-error", classes="dialog-error")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Pause", variant="warning", id="pause-confirm")
                yield Button("Cancel", id="pause-cancel")

    def params(self) -> dict:
        return {"for_s": parse_duration(self.query_one("#pause-duration", Input).value)}
