"""What each key does and what the states mean."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

HELP = """\
# p2ptrain

This screen shows the p2ptrain daemon on this machine. Quitting it (`q`)
leaves the daemon running: training goes on in the background.

| key | what it does |
|---|---|
| `j` | join a run (or start a new one) |
| `p` | pause training at once (until you resume), or resume it |
| `t` | pause for a while (e.g. `2h`, `1h30m`); training resumes by itself |
| `f` | finish the current epoch, then pause |
| `l` | leave the run (asks first) |
| `i` | the hardware plan: precision, quantization, micro-batch and why |
| `?` | this help |
| `q` | quit this screen; the daemon keeps running |
| `ctrl+p` | the command palette: every action above by name |

**States**: *idle* (in no run), *joining*, *training*, *paused* (always with a
reason: you, you are using the computer, battery, another program on the GPU,
temperature, schedule, out-of-memory back-off), *finishing*, *leaving*, *error*
(with a fix).

The same controls from a shell: `p2ptrain status`, `p2ptrain pause --for 2h`,
`p2ptrain resume`, `p2ptrain leave`.
"""


class HelpScreen(ModalScreen[None]):
    """Key bindings and states; any of escape, ? or q closes it."""

    AUTO_FOCUS = "#help-dialog"
    BINDINGS = [("escape", "dismiss_help", "Close"), ("question_mark", "dismiss_help", "Close"), ("q", "dismiss_help", "Close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="dialog", id="help-dialog"):
            yield Markdown(HELP)

    def action_dismiss_help(self) -> None:
        self.dismiss(None)
