"""Loss over time: the training loss of every step and the validation loss of every epoch."""

from __future__ import annotations

from textual.reactive import reactive
from textual_plotext import PlotextPlot

# Enough points for the widest terminal; more only slows plotext down.
MAX_POINTS = 400


def thin_out(points: list[tuple[float, float]], limit: int = MAX_POINTS) -> list[tuple[float, float]]:
    """Every n-th point so that at most ``limit`` remain, always keeping the newest."""
    if len(points) <= limit:
        return points
    stride = -(-len(points) // limit)
    return points[::-1][::stride][::-1]


class LossChart(PlotextPlot):
    """Training and validation loss of the current run against hours since its first step."""

    steps: reactive[tuple] = reactive(())
    epochs: reactive[tuple] = reactive(())

    def _replot(self) -> None:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        train = [(row["ts"], row["loss"]) for row in self.steps if row.get("loss") is not None and row.get("ts")]
        validation = [
            (row["ended_at"], row["val_loss"])
            for row in self.epochs
            if row.get("val_loss") is not None and row.get("ended_at")
        ]
        if not train and not validation:
            plt.title("no loss recorded yet")
            self.refresh()
            return
        start = min(ts for ts, _ in train + validation)
        train = thin_out(train)
        if train:
            plt.plot([(ts - start) / 3600 for ts, _ in train], [loss for _, loss in train], label="train", marker="braille")
        if validation:
            plt.scatter(
                [(ts - start) / 3600 for ts, _ in validation], [loss for _, loss in validation], label="validation"
            )
        plt.xlabel("hours")
        self.refresh()

    def on_mount(self) -> None:
        self._replot()

    def watch_steps(self) -> None:
        if self.is_mounted:
            self._replot()

    def watch_epochs(self) -> None:
        if self.is_mounted:
            self._replot()
