"""Pause training for a while: the daemon resumes by itself when the time is up."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label

from p2ptrain.durations import ACCEPTED_FORMS, parse_duration


class PauseDialog(ModalScreen[dict | None]):
    """Dismisses with the ``pause`` params (``{"for_s": seconds}``), or None when cancelled."""

    AUTO_FOCUS = "#pause-duration"
    BINDINGS = [("escape", "cancel", "Cancel")]

    def compose(self) -> ComposeResult:
        with Vertical(id="pause-dialog", classes="dialog"):
            yield Label("[b]Pause training for a while[/b]")
            yield Label(f"For how long? (e.g. {ACCEPTED_FORMS}); training resumes by itself")
            yield Input(placeholder="2h", id="pause-duration")
            yield Label("", id="pause-error", classes="dialog-error")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Pause", variant="warning", id="pause-confirm")
                yield Button("Cancel", id="pause-cancel")

    def on_input_submitted(self) -> None:
        self._submit()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "pause-confirm":
            self._submit()
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)

    def _submit(self) -> None:
        try:
            seconds = parse_duration(self.query_one("#pause-duration", Input).value)
        except ValueError as error:
            self.query_one("#pause-error", Label).update(str(error))
            return
        self.dismiss({"for_s": seconds})
