"""The TUI is a thin client: it never imports the training stack, and it defers its slow imports.

Checked in a fresh interpreter (the test process itself has imported
everything), by reading ``sys.modules`` after the app has shown the fake
daemon's dashboard with its charts and the help screen.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

TRAINING_STACK = ("torch", "hivemind", "transformers", "peft", "bitsandbytes")
# Imported only after the first frame (charts) or on demand (help): see P2PTrainApp.mount_charts.
DEFERRED = ("textual_plotext", "plotext", "markdown_it")

CHILD = r"""
import asyncio, json, sys, tempfile
sys.path.insert(0, sys.argv[1])
from fake_daemon import FakeDaemon

def loaded(names):
    return sorted({module.split(".")[0] for module in sys.modules} & set(names))

import p2ptrain.tui.app
from p2ptrain.tui.connection import find_daemon
report = {"deferred_at_import": loaded(sys.argv[3].split(","))}

async def show_everything(home):
    app = p2ptrain.tui.app.P2PTrainApp(find_daemon(home))
    async with app.run_test(size=(120, 40)) as pilot:
        while not (app.state == "training" and app.charts_ready):
            await pilot.pause(0.05)
        await pilot.press("question_mark")
        while not app.screen.query("#help-dialog"):
            await pilot.pause(0.05)
        await pilot.press("q")

with tempfile.TemporaryDirectory() as home, FakeDaemon(home):
    asyncio.run(show_everything(home))
report["deferred_after_use"] = loaded(sys.argv[3].split(","))
report["training_stack"] = loaded(sys.argv[2].split(","))
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def modules() -> dict:
    tests_tui = str(Path(__file__).parent)
    finished = subprocess.run(
        [sys.executable, "-c", CHILD, tests_tui, ",".join(TRAINING_STACK), ",".join(DEFERRED)],
        capture_output=True, text=True, timeout=100, check=False,
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    return json.loads(finished.stdout.strip().splitlines()[-1])


def test_the_tui_never_imports_torch_or_hivemind(modules):
    assert modules["training_stack"] == []


def test_charts_and_help_are_imported_after_the_first_frame_not_before(modules):
    assert modules["deferred_at_import"] == []
    # The probe is real: the same modules are there once the charts and the help were shown.
    assert modules["deferred_after_use"] == sorted(DEFERRED)
