"""The daemon's ``/metrics``: its state, this machine's contribution, its GPUs and the run it sees, for Prometheus.

Off unless ``[metrics] listen = "127.0.0.1:9464"`` is set (config.py:
``MetricsSettings``). It serves on the daemon's own loop
(``p2ptrain.http_endpoint``), built from the same ``status`` and ``peers``
results that the control socket answers, so a scrape shows what
``p2ptrain status`` would. The run's and its peers' families are the run
monitor's too (``p2ptrain.swarm_metrics``); the names of the others are in
DEVELOPERS.md, "Metrics".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from p2ptrain.daemon import state as states
from p2ptrain.http_endpoint import Response, start_endpoint
from p2ptrain.openmetrics import CONTENT_TYPE, OpenMetricsText
from p2ptrain.swarm_metrics import add_peers, add_run

log = logging.getLogger(__name__)

MIB = 1024 * 1024


def daemon_metrics(status: dict, peers: dict) -> str:
    """The OpenMetrics text of one daemon.

    Args:
        status: the ``status`` result (docs/design.md, "Control protocol").
        peers: the ``peers`` result: ``peers`` (PeerRows) and ``bans`` of the run.
    """
    text = OpenMetricsText()
    text.add("p2ptrain_daemon", "info", "this daemon", 1, version=status.get("version"))
    for state in states.STATES:
        text.add("p2ptrain_daemon_state", "stateset", "what the daemon is doing", state == status["state"],
                 p2ptrain_daemon_state=state)
    for reason in states.PAUSE_REASONS:
        text.add("p2ptrain_daemon_pause_reason", "stateset", "why the daemon is paused (none set: not paused)",
                 reason == status.get("pause_reason"), p2ptrain_daemon_pause_reason=reason)
    text.add("p2ptrain_daemon_start_time_seconds", "gauge", "when the daemon started (Unix time)", status.get("started_at"))
    for level in ("error", "warning"):
        text.add("p2ptrain_daemon_health_problems", "gauge", "health lines of p2ptrain status, by level",
                 sum(1 for line in status.get("health") or [] if line.get("level") == level), level=level)
    _add_local(text, status.get("local"))
    _add_gpus(text, (status.get("hardware") or {}).get("gpus") or [])
    run = status.get("run")
    if run:
        add_run(text, run)
        add_peers(text, run["id"], peers.get("peers") or [])
        text.add("p2ptrain_run_banned_peers", "gauge", "peers this machine banned from its rounds in the run",
                 len(peers.get("bans") or []), run=run["id"])
    return text.render()


def _add_local(text: OpenMetricsText, local: dict | None) -> None:
    """This machine's peer: summed over its workers, then each worker."""
    if not local:
        return
    text.add("p2ptrain_local_samples_per_second", "gauge", "this machine's training speed, all workers",
             local.get("samples_per_second"))
    text.add("p2ptrain_local_loss", "gauge", "the first worker's latest training loss", local.get("loss"))
    text.add("p2ptrain_local_trained_samples", "counter", "samples this machine trained in the run", local.get("trained_samples"))
    text.add("p2ptrain_local_contributed_samples", "counter", "of those, samples the run used", local.get("contributed_samples"))
    for reason, count in (local.get("unused_samples") or {}).items():
        text.add("p2ptrain_local_unused_samples", "counter", "of those, samples the run will never use, by reason",
                 count, reason=reason)
    for worker in local.get("workers") or []:
        labels = {"device": worker.get("device") or "?"}
        text.add("p2ptrain_worker_samples_per_second", "gauge", "one worker's training speed",
                 worker.get("samples_per_second"), **labels)
        text.add("p2ptrain_worker_micro_batch", "gauge", "one worker's micro-batch", worker.get("micro_batch"), **labels)
    traffic = local.get("traffic") or {}
    for kind, rate in (traffic.get("bytes_per_s") or {}).items():
        text.add("p2ptrain_traffic_bytes_per_second", "gauge", "sent + received over the last minute, by kind", rate, kind=kind)
    if traffic.get("month_used_gb") is not None:
        text.add("p2ptrain_traffic_month_bytes", "gauge", "bytes sent and received this calendar month",
                 traffic["month_used_gb"] * 1e9)


def _add_gpus(text: OpenMetricsText, gpus: list[dict]) -> None:
    for gpu in gpus:
        labels = {"gpu": str(gpu.get("index")), "name": gpu.get("name")}
        text.add("p2ptrain_gpu_memory_used_bytes", "gauge", "GPU memory in use (all processes)",
                 _times(gpu.get("memory_used_mib"), MIB), **labels)
        text.add("p2ptrain_gpu_memory_total_bytes", "gauge", "GPU memory", _times(gpu.get("memory_total_mib"), MIB), **labels)
        text.add("p2ptrain_gpu_utilization_ratio", "gauge", "share of time the GPU computed",
                 _times(gpu.get("utilization_pct"), 0.01), **labels)
        text.add("p2ptrain_gpu_temperature_celsius", "gauge", "GPU temperature", gpu.get("temperature_c"), **labels)
        text.add("p2ptrain_gpu_power_watts", "gauge", "GPU power draw", gpu.get("power_w"), **labels)


def _times(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


async def serve_metrics(listen: str, status: Callable[[], dict], peers: Callable[[dict], Awaitable[dict]]) -> asyncio.Server:
    """Start ``/metrics`` on ``listen`` (``HOST:PORT``); raises ``http_endpoint.ListenError``.

    Args:
        status: the daemon's ``status`` (called on the loop, at each scrape).
        peers: the control method ``peers`` (``ControlMethods.peers``), awaited with ``{}``.
    """

    async def metrics() -> Response:
        return Response(daemon_metrics(status(), await peers({})).encode(), CONTENT_TYPE)

    return await start_endpoint(listen, {"/metrics": metrics})
