"""Writing the OpenMetrics text format (what Prometheus scrapes from ``/metrics``), standard library only.

The daemon's ``/metrics`` (``daemon/metrics_endpoint.py``) and the run
monitor's (``monitor/run_metrics.py``) both build their text here, so the two
follow the same rules: every family has ``# TYPE`` and ``# HELP`` lines and
its samples together, a counter's sample ends in ``_total``, an info metric's
in ``_info``, label values are escaped, and the text ends with ``# EOF``.
Metric names carry their unit in the name (``_seconds``, ``_bytes``).

Spec: https://github.com/prometheus/OpenMetrics/blob/main/specification/OpenMetrics.md
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
KINDS = ("gauge", "counter", "info", "stateset")


@dataclass
class _Family:
    kind: str
    help: str
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


class OpenMetricsText:
    """One exposition: add samples family by family, in any order, then :meth:`render`.

    Example::

        text = OpenMetricsText()
        text.add("p2ptrain_run_epoch", "gauge", "the swarm's epoch", 3, run="demo")
        text.render()
    """

    def __init__(self) -> None:
        self._families: dict[str, _Family] = {}

    def add(self, name: str, kind: str, help_text: str, value: float | bool | None, /, **labels: object) -> None:
        """Add one sample of the family ``name``; a ``None`` value is left out (unknown, not zero).

        Args:
            name: the family's name, ``p2ptrain_...``; a counter's without ``_total``,
                an info metric's without ``_info``.
            kind: ``gauge``, ``counter``, ``info`` (value 1, the facts in labels) or
                ``stateset`` (one sample per state, the label named like the family).
            help_text: one line saying what it measures; the family keeps the first one given.
            value: the number (a stateset's: whether the state is the current one).
            labels: label names and values; ``None`` values become empty strings.
        """
        if kind not in KINDS:
            raise ValueError(f"unknown OpenMetrics type {kind!r}; one of {', '.join(KINDS)}")
        family = self._families.setdefault(name, _Family(kind, help_text))
        if family.kind != kind:
            raise ValueError(f"{name} is a {family.kind}, not a {kind}")
        if value is None:
            return
        family.samples.append(({key: "" if label is None else str(label) for key, label in labels.items()}, value))

    def render(self) -> str:
        """The exposition text, ``# EOF`` included; families without samples are left out."""
        lines = []
        for name, family in self._families.items():
            if not family.samples:
                continue
            lines.append(f"# TYPE {name} {family.kind}")
            lines.append(f"# HELP {name} {_escape(family.help)}")
            suffix = {"counter": "_total", "info": "_info"}.get(family.kind, "")
            for labels, value in family.samples:
                label_text = ",".join(f'{key}="{_escape(label)}"' for key, label in labels.items())
                lines.append(f"{name}{suffix}{{{label_text}}} {_number(value)}" if label_text else f"{name}{suffix} {_number(value)}")
        lines.append("# EOF")
        return "\n".join(lines) + "\n"
