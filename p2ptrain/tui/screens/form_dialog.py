"""A dialog of fields that answers with a request's params: Enter or the confirm button submits, Escape or
the other button cancels, and a field the daemon would refuse is said under the fields, in one line."""

from __future__ import annotations

from textual.screen import ModalScreen
from textual.widgets import Button, Label


class FormDialog(ModalScreen[dict | None]):
    """Dismisses with ``params()`` once they are valid, or None when cancelled.

    A subclass composes its fields, a ``Label`` with id ``ERROR_ID`` and a ``Button``
    with id ``CONFIRM_ID``, and reads its fields in ``params``.
    """

    BINDINGS = [("escape", "cancel", "Cancel")]
    CONFIRM_ID = "confirm"
    ERROR_ID = "error"

    def params(self) -> dict:
        """The request's params from the fields; ValueError with a one-line hint for a bad one."""
        raise NotImplementedError

    def on_input_submitted(self) -> None:
        self._submit()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == self.CONFIRM_ID:
            self._submit()
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)

    def _submit(self) -> None:
        try:
            params = self.params()
        except ValueError as error:
            self.query_one(f"#{self.ERROR_ID}", Label).update(str(error))
            return
        self.dismiss(params)
