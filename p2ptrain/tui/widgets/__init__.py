"""The dashboard's widgets, one a module."""

from __future__ import annotations

from textual.widgets import Static


def show_text(label: Static, text: str) -> None:
    """Put ``text`` in ``label``, unless it is there already.

    The clock ticks every second, and most of what it touches ("up 1d 02h")
    reads the same as before: an update would lay out and repaint the screen
    for nothing.
    """
    if label.content != text:
        label.update(text)
