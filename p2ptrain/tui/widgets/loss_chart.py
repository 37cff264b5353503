"""Loss over time: the training loss of every step and the validation loss of every epoch."""

from __future__ import annotations

from math import ceil
from time import monotonic

from textual.reactive import var
from textual.timer import Timer

from p2ptrain.tui.widgets.chart import Chart

# Enough points for the widest terminal; more only slows plotext down.
MAX_POINTS = 400
# A training worker reports a step every second; a curve over minutes or hours needs no redraw that often.
REDRAW_EVERY_S = 5.0
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


class LossChart(Chart):
    """Training and validation loss of the current run against the time since its first step:
    a training line per worker (``step`` rows carry the worker's name) when there are several."""

    steps: var[tuple] = var(())
    epochs: var[tuple] = var(())

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._last_replot = float("-inf")
        self._redraw_timer: Timer | None = None
        self._drew_a_loss = False

    def _replot(self) -> None:
        self._last_replot = monotonic()
        self._redraw_timer = None
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        trained = [row for row in self.steps if row.get("loss") is not None and row.get("ts")]
        workers = sorted({row.get("worker") or "" for row in trained})
        lines = {worker: [(row["ts"], row["loss"]) for row in trained if (row.get("worker") or "") == worker] for worker in workers}
        train = [(row["ts"], row["loss"]) for row in trained]
        validation = [
            (row["ended_at"], row["val_loss"])
            for row in self.epochs
            if row.get("val_loss") is not None and row.get("ended_at")
        ]
        self._drew_a_loss = bool(train or validation)
        if not self._drew_a_loss:
            plt.title("no loss recorded yet")
            self.redraw()
            return
        start = min(ts for ts, _ in train + validation)
        for worker, points in lines.items():  # a line per worker (one per GPU)
            points = thin_out(points)
            label = f"train {worker}" if len(lines) > 1 else "train"
            plt.plot([(ts - start) / 60 for ts, _ in points], [loss for _, loss in points], label=label, marker="braille")
        if validation:
            plt.scatter([(ts - start) / 60 for ts, _ in validation], [loss for _, loss in validation], label="validation")
        plt.xticks(*elapsed_ticks(max(ts for ts, _ in train + validation) - start))
        plt.xlabel("time since the first step")
        self.redraw()

    def on_mount(self) -> None:
        self._replot()

    @property
    def redraw_pending(self) -> bool:
        """True while new data waits for the next redraw (at most ``REDRAW_EVERY_S`` away)."""
        return self._redraw_timer is not None

    def _data_changed(self) -> None:
        """Redraw now if the last redraw is older than ``REDRAW_EVERY_S`` or showed no loss yet (the first
        losses, such as the history that arrives after the chart was mounted empty, are not kept waiting),
        else once that much has passed."""
        if not self.is_mounted or self._redraw_timer is not None:
            return
        wait = self._last_replot + REDRAW_EVERY_S - monotonic()
        if wait <= 0 or not self._drew_a_loss:
            self._replot()
        else:
            self._redraw_timer = self.set_timer(wait, self._replot)

    def watch_steps(self) -> None:
        self._data_changed()

    def watch_epochs(self) -> None:
        self._data_changed()
