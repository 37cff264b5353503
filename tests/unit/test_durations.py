"""The one duration parser of the CLI (`pause --for`) and the TUI (its timed pause)."""

from __future__ import annotations

import pytest

from p2ptrain.durations import ACCEPTED_FORMS, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("45m", 2700), ("2h", 7200), ("1h30m", 5400), ("1d", 86400), ("1d12h", 129600),
     ("1h 30m", 5400), (" 2H ", 7200), ("1.5h", 5400), ("1d2h3m4s", 93784)],
)
def test_durations_people_write(text, seconds):
    assert parse_duration(text) == seconds


def test_a_bare_number_is_refused_naming_the_units_it_needs():
    with pytest.raises(ValueError) as error:
        parse_duration("90")
    assert str(error.value) == f"'90' has no unit; use e.g. {ACCEPTED_FORMS}"


@pytest.mark.parametrize("text", ["", "soon", "2x", "h2", "30m1h", "1h1h", "-1h", "1e3s", "0m", "0h0s"])
def test_anything_else_is_one_line_naming_the_accepted_forms(text):
    with pytest.raises(ValueError) as error:
        parse_duration(text)
    message = str(error.value)
    assert "\n" not in message and message.endswith(f"use e.g. {ACCEPTED_FORMS}") and repr(text) in message
