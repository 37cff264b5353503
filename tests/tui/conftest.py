"""Fixtures for the TUI's tests: a fake daemon on a real Unix socket and an app that shows it."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fake_daemon import FakeDaemon  # noqa: E402
from fake_data import FROZEN_NOW  # noqa: E402

from p2ptrain.tui.app import P2PTrainApp  # noqa: E402
from p2ptrain.tui.connection import find_daemon  # noqa: E402

# Event times are shown in local time: pin the zone so snapshots match everywhere.
os.environ["TZ"] = "UTC"
time.tzset()


@pytest.fixture
def daemon(tmp_path):
    """A fake daemon in the training state, stopped after the test."""
    with FakeDaemon(tmp_path / "home") as fake:
        yield fake


def make_app(home, **options) -> P2PTrainApp:
    """The real app on ``home``'s socket, with a frozen clock."""
    options.setdefault("clock", lambda: FROZEN_NOW)
    return P2PTrainApp(find_daemon(home), **options)


async def wait_until(pilot, condition, timeout: float = 10.0, what: str = "condition") -> None:
    """Let the app run until ``condition()`` holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await pilot.pause(0.05)


def svg_difference(request, limit: int = 40) -> str:
    """The lines where a failed ``snap_compare`` picture differs from its snapshot, for the failure message.

    pytest-textual-snapshot puts the pictures in an HTML report only when the whole run fails; a
    failure that a rerun mends would leave no trace of what differed.
    """
    import difflib
    import pickle
    import re

    from pytest_textual_snapshot import node_to_report_path

    data = pickle.loads(node_to_report_path(request.node).read_bytes())
    expected, actual = data[1], data[2]

    def lines(svg: str) -> list[str]:
        return re.sub(r"terminal-\d+", "terminal", svg).splitlines()

    def where_they_part(before: str, after: str) -> str:
        start = next((i for i, (a, b) in enumerate(zip(before, after)) if a != b), min(len(before), len(after)))
        return f"at {start}: {before[max(0, start - 80):start + 160]!r}\n     now {after[max(0, start - 80):start + 160]!r}"

    expected_lines, actual_lines = lines(expected), lines(actual)
    report = []
    matcher = difflib.SequenceMatcher(None, expected_lines, actual_lines, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        report.append(f"{tag} snapshot lines {i1 + 1}-{i2}, drawn lines {j1 + 1}-{j2}")
        for before, after in zip(expected_lines[i1:i2], actual_lines[j1:j2]):
            report.append("  line " + where_they_part(before, after))
        report.extend(f"  only in the snapshot: {line[:240]!r}" for line in expected_lines[i1 + (j2 - j1):i2])
        report.extend(f"  only drawn: {line[:240]!r}" for line in actual_lines[j1 + (i2 - i1):j2])
    return "\n".join(report[:limit])
