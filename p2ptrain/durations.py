"""Durations as people write them: ``90s``, ``45m``, ``2h``, ``1h30m``, ``1d``, ``1d12h``.

The one parser of the CLI (``p2ptrain pause --for``) and the TUI (its timed
pause), so that the same text means the same time in both. A bare number is
refused rather than guessed: ``90`` could be seconds or minutes, and a pause
ten times too long or too short is worse than a one-line error.

Standard library only: the CLI imports it on every call.
"""

from __future__ import annotations

import re

ACCEPTED_FORMS = "90s, 45m, 2h, 1h30m or 1d"
UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
# Each unit at most once, largest first: "1h30m" but not "30m1h" or "1h1h".
_AMOUNT = r"(\d+(?:\.\d+)?)"
_DURATION = re.compile("".join(rf"(?:{_AMOUNT}\s*{unit}\s*)?" for unit in UNIT_SECONDS))
_BARE_NUMBER = re.compile(rf"{_AMOUNT}")


def parse_duration(text: str) -> float:
    """Seconds in a duration written with units, e.g. ``1h30m`` -> 5400.0.

    Args:
        text: amounts with units ``d``, ``h``, ``m``, ``s`` (case and spaces
            ignored), largest unit first, each unit at most once; an amount
            may have decimals (``1.5h``).

    Raises:
        ValueError: with a one-line message naming the accepted forms, for
            text that is not such a duration, a bare number, or zero.
    """
    compact = text.strip().lower()
    if _BARE_NUMBER.fullmatch(compact):
        raise ValueError(f"{text!r} has no unit; use e.g. {ACCEPTED_FORMS}")
    match = _DURATION.fullmatch(compact)
    if not compact or not match:
        raise ValueError(f"{text!r} is not a duration; use e.g. {ACCEPTED_FORMS}")
    seconds = sum(float(amount) * UNIT_SECONDS[unit] for amount, unit in zip(match.groups(), UNIT_SECONDS) if amount)
    if seconds <= 0:
        raise ValueError(f"{text!r} is no time at all; use e.g. {ACCEPTED_FORMS}")
    return seconds
