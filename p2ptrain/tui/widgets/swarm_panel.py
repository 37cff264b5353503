"""The swarm at a glance: global epoch, progress to the next one, peers, last averaging."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.reactive import reactive, var
from textual.widget import Widget
from textual.content import Content
from textual.widgets import Label

from p2ptrain.control_types import RunStatus
from p2ptrain.tui.formatting import format_age, format_count, format_duration
from p2ptrain.tui.widgets import show_text


class EpochProgress(Widget):
    """A bar of samples accumulated against the target batch size, with the percentage.

    Drawn as text rather than with Textual's ProgressBar, whose animation would
    make the screen differ from one moment to the next.
    """

    fraction: reactive[float | None] = reactive(None)

    def render(self) -> Content:
        if self.fraction is None:
            return Content("")
        cells = max(1, self.size.width - 5)
        filled = round(cells * self.fraction)
        return Content.from_markup(
            f"[$success]{'━' * filled}[/][$text-muted]{'╺' * (cells - filled)}[/] {self.fraction * 100:3.0f}%"
        )


class SwarmPanel(Widget):
    """Progress of the current run's epoch across all peers."""

    BORDER_TITLE = "Swarm"

    run: var[RunStatus | None] = var(None)
    last_averaging: var[float | None] = var(None)
    now: var[float] = var(0.0)

    def compose(self) -> ComposeResult:
        yield Label("", id="swarm-epoch")
        yield EpochProgress(id="swarm-progress")
        yield Label("", id="swarm-facts")

    def _refresh_view(self) -> None:
        epoch = self.query_one("#swarm-epoch", Label)
        progress = self.query_one(EpochProgress)
        facts = self.query_one("#swarm-facts", Label)
        run = self.run
        if not run:
            show_text(epoch, "No run · press [b]j[/b] to join one")
            progress.fraction = None
            show_text(facts, f"last averaging {format_age(self.last_averaging, self.now)}")
            return
        accumulated = run.samples_accumulated
        target = run.target_batch_size or 0
        show_text(epoch, f"Epoch [b]{run.epoch}[/b] · samples {format_count(accumulated)} / {format_count(target)}")
        progress.fraction = min(1.0, accumulated / target) if target else None
        # A paused daemon shows the run as its worker last reported it (``as_of``), not a live estimate.
        as_of = run.as_of
        timing = f"as of {format_age(as_of, self.now)}" if as_of else f"next epoch in {format_duration(run.eta_next_epoch_s)}"
        show_text(
            facts,
            f"{timing} · "
            f"{run.num_peers} peers · "
            f"last averaging {format_age(self.last_averaging, self.now)}"
        )

    def on_mount(self) -> None:
        self._refresh_view()

    def watch_run(self) -> None:
        if self.is_mounted:
            self._refresh_view()

    def watch_last_averaging(self) -> None:
        if self.is_mounted:
            self._refresh_view()

    def watch_now(self) -> None:
        if self.is_mounted:
            self._refresh_view()
