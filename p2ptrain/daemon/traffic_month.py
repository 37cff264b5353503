"""This machine's network traffic in the current calendar month, for ``policy.max_monthly_traffic_gb``.

Each training worker reports its bytes sent and received since it started
(``traffic`` reports, ``peers/net/traffic.py``); this adds up what is new in each
report, per calendar month in local time, and keeps the month's total in the
``settings`` table so a restarted daemon (or machine) does not forget what was
already spent. ``monthly_estimate_gb`` extrapolates a rate to a whole month.
"""

from __future__ import annotations

import calendar
from datetime import datetime
from typing import Callable

SETTING_KEY = "traffic_month"
GB = 1e9


def monthly_estimate_gb(bytes_per_s: float, moment: datetime) -> float:
    """What ``bytes_per_s`` comes to over the whole calendar month of ``moment``, in GB (10^9 bytes)."""
    days = calendar.monthrange(moment.year, moment.month)[1]
    return bytes_per_s * days * 86400 / GB


class MonthlyTraffic:
    """Bytes sent and received by this machine's workers this month.

    Args:
        load, save: read and write the persisted ``{"month": "YYYY-MM", "bytes": float}``
            (the daemon's ``settings`` table).
        wallclock: local time now.
    """

    def __init__(self, load: Callable[[], dict | None], save: Callable[[dict], None],
                 wallclock: Callable[[], datetime] = datetime.now):
        self._save, self.wallclock = save, wallclock
        saved = load() or {}
        self.month = saved.get("month") if isinstance(saved.get("month"), str) else self._this_month()
        self.bytes = float(saved.get("bytes") or 0.0) if isinstance(saved.get("bytes"), (int, float)) else 0.0
        self._worker_totals: dict[tuple[str, float], float] = {}

    def _this_month(self) -> str:
        return self.wallclock().strftime("%Y-%m")

    def _roll(self) -> None:
        month = self._this_month()
        if month != self.month:
            self.month, self.bytes = month, 0.0

    def add_report(self, worker: str, since: float, sent_bytes: float, received_bytes: float) -> None:
        """Count what worker process ``(worker, since)`` moved since its previous report.

        Args:
            worker: the worker's name; ``since``: when its process began counting
                (a restarted worker counts from zero again).
            sent_bytes, received_bytes: its totals since ``since``.
        """
        total = float(sent_bytes) + float(received_bytes)
        key = (worker, since)
        before = self._worker_totals.get(key, 0.0)
        self._worker_totals = {other: value for other, value in self._worker_totals.items() if other[0] != worker}
        self._worker_totals[key] = total
        self._roll()
        self.bytes += max(0.0, total - before)
        self._save({"month": self.month, "bytes": self.bytes})

    def used_gb(self) -> float:
        """GB sent and received so far this month."""
        self._roll()
        return self.bytes / GB
