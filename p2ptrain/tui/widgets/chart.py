"""A plotext chart that is drawn again only when its data, size or theme changed."""

from __future__ import annotations

from textual.app import RenderResult
from textual_plotext import PlotextPlot


class Chart(PlotextPlot):
    """``PlotextPlot`` builds its whole plot each time Textual renders the widget.

    Textual renders it whenever the screen around it is laid out or repainted,
    which happens every second or two on a dashboard fed by a training daemon;
    building a plot is the most expensive thing the TUI does. Subclasses call
    ``redraw`` after they changed the plot; in between, the last picture is
    reused.
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._picture: RenderResult | None = None
        self._picture_of: tuple | None = None
        self._version = 0

    def redraw(self) -> None:
        """The plot changed: build it at the next render."""
        self._version += 1
        self.refresh()

    def render(self) -> RenderResult:
        key = (self._version, self.size, self.app.theme, self.theme)
        if key != self._picture_of:
            self._picture = super().render()
            self._picture_of = key
        return self._picture
