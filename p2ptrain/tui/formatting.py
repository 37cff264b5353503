"""Numbers, durations and ages in the words a volunteer reads at a glance."""

from __future__ import annotations


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

