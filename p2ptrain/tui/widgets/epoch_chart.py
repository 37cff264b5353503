"""How long each epoch of the run took, as bars."""

from __future__ import annotations

from textual.reactive import reactive
from textual_plotext import PlotextPlot

# The newest epochs only: older bars would be too thin to read.
MAX_BARS = 40


class EpochChart(PlotextPlot):
    """Epoch durations in minutes, newest on the right."""

    epochs: reactive[tuple] = reactive(())

    def _replot(self) -> None:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        finished = [row for row in self.epochs if row.get("duration_s") is not None][-MAX_BARS:]
        if not finished:
            plt.title("no finished epoch yet")
        else:
            plt.bar([str(row.get("epoch")) for row in finished], [row["duration_s"] / 60 for row in finished], width=0.5)
            plt.ylabel("minutes")
        self.refresh()

    def on_mount(self) -> None:
        self._replot()

    def watch_epochs(self) -> None:
        if self.is_mounted:
            self._replot()
