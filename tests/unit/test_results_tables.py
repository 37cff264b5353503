"""RESULTS.md's tables come from committed data files through a command: each table here is regenerated
from its data file and compared with what RESULTS.md shows, and the data file with what the code says now."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import plan_table  # noqa: E402


def section(marker: str) -> str:
    """The text of RESULTS.md between ``<!-- marker -->`` and ``<!-- /marker -->``."""
    text = (REPO / "benchmarks" / "RESULTS.md").read_text()
    start, end = f"<!-- {marker} -->", f"<!-- /{marker} -->"
    assert start in text and end in text, f"RESULTS.md has no {start} ... {end} section"
    return text[text.index(start) + len(start):text.index(end)].strip()


def test_the_planner_table_is_what_its_data_file_renders_and_what_the_planner_says_now():
    data = json.loads((REPO / "benchmarks" / "plan_table.json").read_text())
    assert section("plan_table.json") == plan_table.render(data), (
        "regenerate it: .venv/bin/python benchmarks/plan_table.py --report benchmarks/plan_table.json")
    assert data["rows"] == plan_table.plan_rows(), (
        "the planner changed: .venv/bin/python benchmarks/plan_table.py --write benchmarks/plan_table.json, then the report")
