"""The README's quick start: ``./quickstart demo`` as the quickstart script runs it once installed.

``./quickstart`` installs into ``.venv`` and then execs its ``demo)`` line;
this test runs that line with this environment's ``p2ptrain``, the README's
arguments, a bounded ``--duration`` and ``--ui text`` (the demo otherwise runs
until Ctrl-C). ``./quickstart test`` is what CI runs: not run from inside it.

Cost: about 1.5 minutes (the README's three CPU peers: a minute of training, then they stop together).
"""

from __future__ import annotations

import re
import subprocess
import uuid

import pytest

from daemons import P2PTRAIN, child_environment, processes_marked
from readme import code_blocks, quickstart_demo_command, shell_commands

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(480)]

DURATION_S = 60


def test_the_quick_start_demo_trains_a_local_swarm_and_stops_everything_it_started(tmp_path):
    commands = shell_commands(code_blocks("Quick start")[0])
    assert ["./quickstart", "test"] in commands
    demo = next(command for command in commands if command[:2] == ["./quickstart", "demo"])
    program = quickstart_demo_command()
    assert program[0].endswith("/p2ptrain"), program
    mark = uuid.uuid4().hex
    result = subprocess.run(
        [*P2PTRAIN, *program[1:], *demo[2:], "--duration", str(DURATION_S), "--ui", "text"],
        capture_output=True,
        text=True,
        timeout=420,
        # the demo's homes go to a temporary directory: this test's
        env=child_environment({"P2PTRAIN_TEST_MARK": mark, "TMPDIR": str(tmp_path)}),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "run 'demo' (sync) created by peer0" in result.stdout
    epochs = {peer: max(int(epoch) for epoch in re.findall(rf"{peer}: training epoch (\d+)", result.stdout) or ["-1"])
              for peer in ("peer0", "peer1", "peer2")}
    assert min(epochs.values()) >= 0 and max(epochs.values()) >= 1, result.stdout  # three peers train, epochs go by
    assert processes_marked(mark) == []
    assert list(tmp_path.iterdir()) == []  # the demo's homes are gone
