"""The plan cache: what this machine's workers measured, per model, device, precision and quantization.

``cache_dir/plans.json`` maps ``cache_key`` to the calibration a worker last
made (``peers/worker/calibration.py``): the micro-batch that fit and its samples per
second, and the speeds of the other micro-batches it tried. ``p2ptrain plan``
shows it next to its arithmetic, and the daemon's planner orders int8 and nf4
by it (``daemon/plan.py: training_ways``). Stdlib only: the daemon and
``p2ptrain plan`` read it without torch.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

CACHE_FILE = "plans.json"


def cache_key(model: str, device_name: str, precision: str, quantization: str) -> str:
    """One measurement per model, device, precision and quantization."""
    return "|".join((model, device_name, precision, quantization))


def read_plan_cache(cache_dir: str | os.PathLike) -> dict:
    """Every cached measurement by ``cache_key`` ({} when there is none or the file is damaged)."""
    try:
        data = json.loads((Path(cache_dir) / CACHE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def measured_speeds(cache_dir: str | os.PathLike, model: str, device_name: str, precision: str) -> dict[str, float]:
    """Samples/s measured on this device for ``model`` in ``precision``, by quantization ({} when none)."""
    cache = read_plan_cache(cache_dir)
    speeds = {}
    for quantization in ("none", "int8", "nf4"):
        entry = cache.get(cache_key(model, device_name, precision, quantization))
        if isinstance(entry, dict) and isinstance(entry.get("samples_per_second"), (int, float)):
            speeds[quantization] = float(entry["samples_per_second"])
    return speeds


def record_measurement(cache_dir: str | os.PathLike, key: str, measurement: dict) -> None:
    """Store ``measurement`` (JSON values) under ``key`` in ``cache_dir/plans.json``, stamped ``measured_at``.

    Written atomically (a reader never sees half a file). Several workers of one
    daemon share the file: each rewrites it with its own key changed.
    """
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    cache = read_plan_cache(cache_dir)
    cache[key] = {**measurement, "measured_at": time.time()}
    temporary = cache_dir / f".{CACHE_FILE}.{os.getpid()}.tmp"
    temporary.write_text(json.dumps(cache, indent=2, sort_keys=True))
    temporary.replace(cache_dir / CACHE_FILE)
