"""Numbers, durations and ages in the words a volunteer reads at a glance."""

from __future__ import annotations

import re

_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd])")


def format_duration(seconds: float | None) -> str:
    """``3h 05m``, ``4m 10s``, ``12s``; an em dash when unknown."""
    if seconds is None or seconds < 0:
        return "—"
    seconds = int(seconds)
    days, seconds = divmod(seconds, 86400)
    hours, seconds = divmod(seconds, 3600)
    minutes, seconds = divmod(seconds, 60)
    if days:
        return f"{days}d {hours:02d}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {seconds:02d}s"
    return f"{seconds}s"


def format_age(timestamp: float | None, now: float) -> str:
    """How long ago ``timestamp`` was: ``12s ago``; ``never`` when unknown."""
    if timestamp is None:
        return "never"
    return f"{format_duration(max(0.0, now - timestamp))} ago"


def format_count(value: float | None) -> str:
    """``1.2M``, ``35.4k``, ``812``; an em dash when unknown."""
    if value is None:
        return "—"
    for threshold, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= threshold:
            return f"{value / threshold:.1f}{suffix}"
    return f"{value:.0f}"


def format_number(value: float | None, digits: int = 2) -> str:
    """A float with ``digits`` decimals; an em dash when unknown."""
    return "—" if value is None else f"{value:.{digits}f}"


def parse_duration(text: str) -> float | None:
    """Seconds in ``2h``, ``1h30m``, ``45m``, ``90s`` or a bare number of minutes.

    Returns None for an empty text (an open-ended pause); raises ValueError
    with a one-line hint for anything else it cannot read.
    """
    text = text.strip().lower().replace(" ", "")
    if not text:
        return None
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        seconds = float(text) * 60
    elif _DURATION_PART.sub("", text) == "":
        seconds = sum(float(amount) * _DURATION_UNITS[unit] for amount, unit in _DURATION_PART.findall(text))
    else:
        raise ValueError(f"cannot read {text!r} as a duration; write e.g. 2h, 1h30m, 45m or 90s")
    if seconds <= 0:
        raise ValueError("a pause must last longer than 0 seconds; leave the field empty to pause until resumed")
    return seconds
