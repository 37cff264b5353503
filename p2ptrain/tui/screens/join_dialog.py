"""Join a run: an existing one by name and bootstrap address, or a new one with a mode and model."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Checkbox, Input, Label, Select

from p2ptrain.tui.screens.form_dialog import FormDialog

MODES = (("sync: average every target batch", "sync"), ("diloco: average after many local steps", "diloco"))


def join_params(run: str, bootstrap: str, new_run: bool, mode: str, model: str) -> dict:
    """The ``join`` request's params from the dialog's fields.

    Args:
        run: the run id (required).
        bootstrap: multiaddresses of peers already in the run, separated by
            commas or spaces (may be empty for a new run).
        new_run: start the run instead of joining it.
        mode: ``sync`` or ``diloco`` (new runs only).
        model: a preset name, hub id or path (new runs only).

    Raises ValueError with a one-line hint when a field is missing.
    """
    run = run.strip()
    if not run:
        raise ValueError("give the run a name, e.g. tiny-demo")
    initial_peers = bootstrap.replace(",", " ").split()
    if not new_run and not initial_peers:
        raise ValueError("paste a bootstrap address from a peer of the run, e.g. /ip4/1.2.3.4/tcp/31337/p2p/12D3Koo…")
    params: dict = {"run": run, "initial_peers": initial_peers}
    if new_run:
        if not model.strip():
            raise ValueError("name the model to train, e.g. tiny")
        params["new_run"] = True
        params["manifest"] = {"mode": mode, "model": model.strip()}
    return params


class JoinDialog(FormDialog):
    """Asks for a run to join; dismisses with the ``join`` params, or None when cancelled."""

    AUTO_FOCUS = "#join-run"
    CONFIRM_ID, ERROR_ID = "join-confirm", "join-error"

    def compose(self) -> ComposeResult:
        with Vertical(id="join-dialog", classes="dialog"):
            yield Label("[b]Join a training run[/b]")
            yield Label("Run name")
            yield Input(placeholder="tiny-demo", id="join-run")
            yield Label("Bootstrap address (a peer already in the run)")
            yield Input(placeholder="/ip4/…/tcp/…/p2p/12D3Koo…", id="join-bootstrap")
            yield Checkbox("Start a new run instead", id="join-new-run")
            with Vertical(id="join-new-run-fields"):
                yield Select(MODES, value="sync", allow_blank=False, id="join-mode")
                yield Input(value="tiny", placeholder="model: tiny, a hub id or a path", id="join-model")
            yield Label("", id="join-error", classes="dialog-error")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Join", variant="primary", id="join-confirm")
                yield Button("Cancel", id="join-cancel")

    def on_mount(self) -> None:
        self.query_one("#join-new-run-fields").display = False

    def on_checkbox_changed(self, event: Checkbox.Changed) -> None:
        self.query_one("#join-new-run-fields").display = event.value

    def params(self) -> dict:
        return join_params(
            self.query_one("#join-run", Input).value,
            self.query_one("#join-bootstrap", Input).value,
            self.query_one("#join-new-run", Checkbox).value,
            str(self.query_one("#join-mode", Select).value),
            self.query_one("#join-model", Input).value,
        )
