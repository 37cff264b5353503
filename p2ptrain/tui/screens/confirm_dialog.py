"""A yes/no question before an action that cannot be undone from here."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label


class ConfirmDialog(ModalScreen[bool]):
    """Dismisses with True when the user confirms.

    Args:
        question: what is about to happen, as a question.
        confirm_label: the label of the button that goes ahead.
    """

    AUTO_FOCUS = "#confirm-no"
    BINDINGS = [("escape", "cancel", "Cancel"), ("y", "confirm", "Yes"), ("n", "cancel", "No")]

    def __init__(self, question: str, confirm_label: str) -> None:
        super().__init__()
        self.question = question
        self.confirm_label = confirm_label

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.question)
            with Horizontal(classes="dialog-buttons"):
                yield Button(self.confirm_label, variant="error", id="confirm-yes")
                yield Button("Cancel", id="confirm-no")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "confirm-yes")

    def action_confirm(self) -> None:
        self.dismiss(True)

    def action_cancel(self) -> None:
        self.dismiss(False)
