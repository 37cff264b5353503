"""The dashboard's widgets, one a module.

What a widget shows arrives in ``var`` attributes, whose watchers update only
what changed; a ``reactive`` would also repaint the whole widget each time,
and a training daemon pushes something every second.
"""

from __future__ import annotations

from textual.widgets import Static


def show_text(label: Static, text: str) -> None:
    """Put ``text`` in ``label``, redrawing as little of the screen as it can.

    Most updates change a few characters ("41.7 samples/s" -> "40.9 samples/s"),
    many none at all (the clock ticks every second; "up 1d 02h" reads the same).
    An unchanged text is left alone. A label whose box cannot change is redrawn
    in place; only one that may grow or shrink lays the screen out again.
    """
    old = label.content
    if old != text:
        label.update(text, layout=_box_may_change(label, old, text))


def _box_may_change(label: Static, old: object, new: str) -> bool:
    """False when the label keeps its size: as many lines, each as long as before, or each
    fitting (markup counted, so a conservative test) the width its layout gives it."""
    if not isinstance(old, str) or old.count("\n") != new.count("\n"):
        return True
    old_lines, new_lines = old.split("\n"), new.split("\n")
    if [len(line) for line in old_lines] == [len(line) for line in new_lines]:
        return False
    width = label.styles.width
    fixed_width = (width is None or not width.is_auto) and label.size.width > 0
    return not (fixed_width and all(len(line) <= label.size.width for line in old_lines + new_lines))
