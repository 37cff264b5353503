"""The daemon's event log: joins, pauses and why, epochs, errors, newest at the bottom."""

from __future__ import annotations

import time

from rich.text import Text
from textual.reactive import var
from textual.widgets import RichLog

from p2ptrain.control_types import EventRow


def event_line(event: EventRow) -> Text:
    """``14:02:11  paused      on battery`` for one row of the events table (``(x700 in 84 s)``
    after a row that stands for repeats)."""
    clock = time.strftime("%H:%M:%S", time.localtime(event.ts))
    line = Text(f"{clock}  ")
    line.append(f"{event.kind:<12}", style="bold")
    line.append(f" {event.message}")
    line.append(event.repeated_words(), style="dim")
    return line


class EventLog(RichLog):
    """Appends the events it has not shown yet; writes them all again when a row shown grew
    (a row of repeats with a new count, at most every few seconds)."""

    BORDER_TITLE = "Events"

    events: var[tuple[EventRow, ...]] = var(())

    def __init__(self, **kwargs) -> None:
        super().__init__(wrap=False, max_lines=500, **kwargs)
        self._shown: dict[tuple, int] = {}  # (ts, kind) -> the count shown

    def watch_events(self, events: tuple) -> None:
        keys = [(event.ts, event.kind) for event in events]
        grew = any(key in self._shown and self._shown[key] != (event.count or 1) for key, event in zip(keys, events))
        last = max((key[0] or 0 for key in self._shown), default=None)
        if grew:
            self.clear()
            new = list(events)
        else:
            new = [event for event in events if last is None or event.ts > last]
        for event in new:
            self.write(event_line(event))
        self._shown = {key: event.count or 1 for key, event in zip(keys, events)}
