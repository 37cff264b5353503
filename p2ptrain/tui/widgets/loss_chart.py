"""Loss over time: the training loss of every step and the validation loss of every epoch."""

from __future__ import annotations

from math import ceil

from textual.reactive import reactive
from textual_plotext import PlotextPlot

# Enough points for the widest terminal; more only slows plotext down.
MAX_POINTS = 400
# Spacings of the time axis' ticks, in seconds: the first that puts at most MAX_TICKS ticks on the axis.
TICK_SPACINGS_S = (10, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800)
MAX_TICKS = 6


def thin_out(points: list[tuple[float, float]], limit: int = MAX_POINTS) -> list[tuple[float, float]]:
    """Every n-th point so that at most ``limit`` remain, always keeping the newest."""
    if len(points) <= limit:
        return points
    stride = -(-len(points) // limit)
    return points[::-1][::stride][::-1]


def elapsed_label(seconds: float) -> str:
    """A tick of elapsed time as durations are written (``0``, ``30s``, ``5m``, ``1h30m``, ``2d``)."""
    rest = round(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        amount, rest = divmod(rest, size)
        if amount:
            parts.append(f"{amount}{unit}")
    return "".join(parts) or "0"


def elapsed_ticks(span_s: float) -> tuple[list[float], list[str]]:
    """Ticks for a time axis from 0 to ``span_s`` seconds: positions in minutes, and their labels.

    Round spacings (30s, 5m, 1h, ...), at most ``MAX_TICKS`` of them, so the
    axis reads "0 10m 20m 30m" whatever the run's age.
    """
    spacing = next((size for size in TICK_SPACINGS_S if span_s / size < MAX_TICKS), None)
    if spacing is None:
        weeks = TICK_SPACINGS_S[-1]
        spacing = weeks * ceil(span_s / weeks / MAX_TICKS)
    seconds = [index * spacing for index in range(int(span_s // spacing) + 1)]
    return [tick / 60 for tick in seconds], [elapsed_label(tick) for tick in seconds]


class LossChart(PlotextPlot):
    """Training and validation loss of the current run against the time since its first step."""

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
            plt.plot([(ts - start) / 60 for ts, _ in train], [loss for _, loss in train], label="train", marker="braille")
        if validation:
            plt.scatter([(ts - start) / 60 for ts, _ in validation], [loss for _, loss in validation], label="validation")
        plt.xticks(*elapsed_ticks(max(ts for ts, _ in train + validation) - start))
        plt.xlabel("time since the first step")
        self.refresh()

    def on_mount(self) -> None:
        self._replot()

    def watch_steps(self) -> None:
        if self.is_mounted:
            self._replot()

    def watch_epochs(self) -> None:
        if self.is_mounted:
            self._replot()
