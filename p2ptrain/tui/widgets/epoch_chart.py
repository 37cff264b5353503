"""How long each epoch of the run took, as bars."""

from __future__ import annotations

from math import floor, log10

from textual.reactive import var

from p2ptrain.tui.widgets.chart import Chart

# The newest epochs only: older bars would be too thin to read.
MAX_BARS = 40
MAX_TICKS = 5


def round_ticks(top: float, most: int = MAX_TICKS) -> list[float]:
    """0 and round steps (1, 2 or 5 times a power of ten) up to ``top``: at most ``most`` + 1 ticks."""
    if top <= 0:
        return [0.0]
    step = 10 ** floor(log10(top / most))
    step *= next(factor for factor in (1, 2, 5, 10) if top / (step * factor) <= most)
    return [index * step for index in range(int(top // step) + 1)]


class EpochChart(Chart):
    """How many seconds each epoch took, by epoch number, newest on the right."""

    epochs: var[tuple] = var(())

    def _replot(self) -> None:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        finished = [row for row in self.epochs if row.get("duration_s") is not None][-MAX_BARS:]
        if not finished:
            plt.title("no finished epoch yet")
        else:
            seconds = [row["duration_s"] for row in finished]
            plt.bar([str(row.get("epoch")) for row in finished], seconds, width=0.5)
            ticks = round_ticks(max(seconds))
            plt.yticks(ticks, [f"{tick:g}" for tick in ticks])
            plt.xlabel("epoch")
            plt.ylabel("seconds")
        self.redraw()

    def on_mount(self) -> None:
        self._replot()

    def watch_epochs(self) -> None:
        if self.is_mounted:
            self._replot()
