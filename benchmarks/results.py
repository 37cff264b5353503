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


def _guard_cost(path: Path) -> str:
    import guard_cost

    return guard_cost.report([path])


def _diloco_stability(path: Path) -> str:
    import diloco_study

    return diloco_study.stability([path])


def _db_year(path: Path) -> str:
    import db_year

    return db_year.report(path)


def _heterogeneous(path: Path) -> str:
    import heterogeneous

    return heterogeneous.report(path)


def _wan(path: Path) -> str:
    import wan

    return wan.report(path)


def _wan_background(path: Path) -> str:
    import wan

    return wan.background_report(path)


def _gpu_plan(path: Path) -> str:
    import gpu_plan

    return gpu_plan.report(path, again=True)  # estimates by the memory model as it is now


def _scale(path: Path) -> str:
    import scale

    return scale.report(path)


def _scale_model(path: Path) -> str:
    import scale_model

    return scale_model.report(path)


def _compression(path: Path) -> str:
    import compression_table

    return compression_table.report([path])


def _slow_volunteer(path: Path) -> str:
    import slow_volunteer

    return slow_volunteer.report(path)


def _rogue(path: Path) -> str:
    import rogue

    return rogue.report(path)


def _gradient_distance(path: Path) -> str:
    import gradient_distance

    return gradient_distance.report(path)


def _convergence(path: Path) -> str:
    import convergence

    return convergence.rows_table(path)


RENDERERS: dict[str, Callable[[Path], str]] = {
    "plan-table": _plan_table,
    "guard-cost": _guard_cost,
    "diloco-stability": _diloco_stability,
    "convergence": _convergence,
    "compression": _compression,
    "slow-volunteer": _slow_volunteer,
    "rogue": _rogue,
    "gradient-distance": _gradient_distance,
    "gpu-plan": _gpu_plan,
    "wan": _wan,
    "wan-background": _wan_background,
    "db-year": _db_year,
    "scale": _scale,
    "scale-model": _scale_model,
    "heterogeneous": _heterogeneous,
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
