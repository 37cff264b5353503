"""RESULTS.md's generated tables: each one rendered again from its committed data file.

Every generated table in ``benchmarks/RESULTS.md`` sits between two markers:

    <!-- table: NAME from DATAFILE -->
    | ... the table ... |
    <!-- /table: NAME -->

``DATAFILE`` is a path relative to ``benchmarks/`` (the raw data a benchmark wrote, with
its commit, date, machine and load), and ``NAME`` one of ``RENDERERS``: the function,
imported from the benchmark script that wrote the data, that renders the table from it.

    .venv/bin/python benchmarks/results.py --check    # exit 1 and one line per table that differs
    .venv/bin/python benchmarks/results.py --write    # rewrite every marked table from its data file

``tests/unit/test_results_tables.py`` runs the check.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS.md"
if str(HERE) not in sys.path:  # the renderers live in the benchmark scripts beside this file
    sys.path.insert(0, str(HERE))

MARKED = re.compile(r"<!-- table: (?P<name>[\w-]+) from (?P<data>\S+) -->\n(?P<body>.*?)<!-- /table: (?P=name) -->", re.S)


def _plan_table(path: Path) -> str:
    import json

    import plan_table

    return plan_table.render(json.loads(path.read_text()))


def _renderer(module: str, function: str = "report", in_a_list: bool = False, **options) -> Callable[[Path], str]:
    """A renderer that imports ``module`` when first used and returns ``module.function(path, **options)``.

    Args:
        module: the benchmark script beside this file that wrote the data.
        function: its function that renders the table.
        in_a_list: the function takes a list of data files: it gets ``[path]``.
        options: keyword arguments for the function.
    """
    def render(path: Path) -> str:
        return getattr(importlib.import_module(module), function)([path] if in_a_list else path, **options)

    return render


RENDERERS: dict[str, Callable[[Path], str]] = {
    "cli-status": _renderer("cli_status"),
    "peer-throughput": _renderer("peer_throughput"),
    "tui-first-frame": _renderer("tui_first_frame"),
    "tui-cpu": _renderer("tui_cpu"),
    "plan-table": _plan_table,
    "guard-cost": _renderer("guard_cost", in_a_list=True),
    "diloco-stability": _renderer("diloco_study", "stability", in_a_list=True),
    "diloco-sparse": _renderer("diloco_study", "sparse_table", in_a_list=True),
    "group-study": _renderer("group_study", in_a_list=True),
    "convergence": _renderer("convergence", "rows_table"),
    "compression": _renderer("compression_table", in_a_list=True),
    "slow-volunteer": _renderer("slow_volunteer"),
    "soak": _renderer("soak"),
    "rogue": _renderer("rogue"),
    "robust-aggregation": _renderer("robust_aggregation"),
    "gradient-distance": _renderer("gradient_distance"),
    "gpu-plan": _renderer("gpu_plan", again=True),  # estimates by the memory model as it is now
    "wan": _renderer("wan"),
    "wan-background": _renderer("wan", "background_report"),
    "db-year": _renderer("db_year"),
    "scale": _renderer("scale"),
    "scale-model": _renderer("scale_model"),
    "request-framing": _renderer("request_framing"),
    "matchmaking-requests": _renderer("matchmaking_requests"),
    "state-burst": _renderer("state_burst"),
    "round-stall": _renderer("round_stall"),
    "heterogeneous": _renderer("heterogeneous"),
}


@dataclass
class Table:
    name: str
    data: str
    shown: str  # what RESULTS.md has between the markers, stripped
    start: int  # where the body starts and ends in the text
    end: int

    def rendered(self) -> str:
        renderer = RENDERERS.get(self.name)
        if renderer is None:
            raise KeyError(f"RESULTS.md marks a table {self.name!r}; known: {', '.join(RENDERERS)}")
        return renderer(HERE / self.data).strip()


def tables(text: str) -> list[Table]:
    """The marked tables of a RESULTS.md text, in order."""
    return [Table(m["name"], m["data"], m["body"].strip(), m.start("body"), m.end("body")) for m in MARKED.finditer(text)]


def differences(text: str) -> list[str]:
    """One line per marked table of ``text`` that differs from what its data file renders."""
    lines = []
    for table in tables(text):
        try:
            rendered = table.rendered()
        except (OSError, ValueError, KeyError) as error:
            lines.append(f"{table.name} from {table.data}: cannot render: {error}")
            continue
        if rendered != table.shown:
            changed = [line for line in difflib.unified_diff(table.shown.splitlines(), rendered.splitlines(), lineterm="", n=0)
                       if line[:1] in "+-" and not line.startswith(("+++", "---"))]
            first = next((line for line in changed if line.startswith("-")), changed[0] if changed else "")
            lines.append(f"{table.name} from {table.data}: {sum(1 for line in changed if line.startswith('-'))} line(s) differ, "
                         f"first shown: {first[1:][:120]!r}")
    return lines


def rewrite(text: str) -> str:
    """``text`` with every marked table rendered again from its data file."""
    for table in reversed(tables(text)):  # from the end, so earlier positions hold
        text = text[:table.start] + table.rendered() + "\n" + text[table.end:]
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--check", action="store_true", help="exit 1 when a marked table differs from its data file")
    action.add_argument("--write", action="store_true", help="rewrite every marked table from its data file")
    parser.add_argument("--file", type=Path, default=RESULTS, help="the markdown file (default: benchmarks/RESULTS.md)")
    options = parser.parse_args()
    text = options.file.read_text()
    if options.write:
        options.file.write_text(rewrite(text))
        print(f"{len(tables(text))} tables written")
        return 0
    found = differences(text)
    for line in found:
        print(line)
    print(f"{len(tables(text))} tables, {len(found)} differ" + (": run benchmarks/results.py --write" if found else ""))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
