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
