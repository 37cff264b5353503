"""The daemon's event log: joins, pauses and why, epochs, errors, newest at the bottom."""

from __future__ import annotations

import time

from rich.text import Text
from textual.reactive import var
from textual.widgets import RichLog


def event_line(event: dict) -> Text:
    """``14:02:11  paused      on battery`` for one row of the events table."""
    clock = time.strftime("%H:%M:%S", time.localtime(event.get("ts") or 0))
    line = Text(f"{clock}  ")
    line.append(f"{event.get('kind', ''):<12}", style="bold")
    line.append(f" {event.get('message', '')}")
    return line


class EventLog(RichLog):
    """Appends the events it has not shown yet."""

    BORDER_TITLE = "Events"

    events: var[tuple] = var(())

    def __init__(self, **kwargs) -> None:
        super().__init__(wrap=False, max_lines=500, **kwargs)
        self._last_shown_ts: float | None = None

    def watch_events(self, events: tuple) -> None:
        last = self._last_shown_ts
        new = [event for event in events if last is None or (event.get("ts") or 0) > last]
        for event in new:
            self.write(event_line(event))
        if new:
            self._last_shown_ts = new[-1].get("ts") or 0
