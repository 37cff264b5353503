"""`p2ptrain demo`, the README's main job, run as a user would (text progress, bounded duration)."""

from __future__ import annotations

import re
import subprocess
import uuid

import psutil
import pytest

from daemons import P2PTRAIN, child_environment

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(400)]


def processes_marked(mark: str) -> list[psutil.Process]:
    """Processes whose environment carries ``mark`` (inherited by everything the demo starts, p2pd included)."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get("P2PTRAIN_TEST_MARK") == mark:
                found.append(process)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            pass
    return found


def test_demo_trains_a_local_swarm_and_stops_everything_it_started(tmp_path):
    mark = uuid.uuid4().hex
    result = subprocess.run(
        [*P2PTRAIN, "demo", "--peers", "2", "--duration", "90", "--ui", "text", "--dir", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        timeout=360,
        env=child_environment({"P2PTRAIN_TEST_MARK": mark}),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    epochs = [int(epoch) for epoch in re.findall(r"peer1: training epoch (\d+)", result.stdout)]
    assert epochs and max(epochs) >= 1, result.stdout
    assert "run 'demo' (sync) created by peer0" in result.stdout
    assert processes_marked(mark) == []
