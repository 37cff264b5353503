"""Pause training, for a while or until resumed."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label

from p2ptrain.tui.formatting import parse_duration


class PauseDialog(ModalScreen[dict | None]):
    """Dismisses with the ``pause`` params (``for_s`` when a duration was given), or None when cancelled."""

    AUTO_FOCUS = "#pause-duration"
    BINDINGS = [("escape", "cancel", "Cancel")]

    def compose(self) -> ComposeResult:
        with Vertical(id="pause-dialog", classes="dialog"):
            yield Label("[b]Pause training[/b]")
            yield Label("For how long? (e.g. 2h, 45m; empty: until you resume)")
            yield Input(placeholder="until resumed", id="pause-duration")
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
        self.dismiss({} if seconds is None else {"for_s": seconds})
