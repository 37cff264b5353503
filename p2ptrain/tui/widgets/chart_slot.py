"""A bordered panel that a chart moves into once the chart widgets are loaded."""

from __future__ import annotations

from textual.widget import Widget


class ChartSlot(Widget):
    """Where a chart goes; empty until the app mounts the chart after its first frame.

    Importing textual-plotext (and plotext) takes about a tenth of a second,
    which the first frame with the daemon's state should not wait for (see
    ``P2PTrainApp.mount_charts``).

    Args:
        title: the panel's border title, shown from the first frame on.
    """

    def __init__(self, title: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.border_title = title

    @property
    def chart(self) -> Widget | None:
        """The chart in this slot, or None while it is not mounted yet."""
        return self.children[0] if self.children else None
