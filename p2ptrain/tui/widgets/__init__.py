"""The dashboard's widgets, one a module."""

from __future__ import annotations

from textual.widgets import Static


def show_text(label: Static, text: str) -> None:
    """Put ``text`` in ``label``, redrawing as little of the screen as it can.

    Most updates change a few digits ("41.7 samples/s" -> "40.9 samples/s"),
    many none at all (the clock ticks every second; "up 1d 02h" reads the same).
    An unchanged text is left alone; a text whose lines keep their lengths
    cannot wrap differently, so it is redrawn in place without laying out the
    whole screen again.
    """
    old = label.content
    if old == text:
        return
    same_shape = isinstance(old, str) and [len(line) for line in old.split("\n")] == [len(line) for line in text.split("\n")]
    label.update(text, layout=not same_shape)
