"""``policy.max_compute_share`` on a real daemon, set through the CLI as a volunteer would: the worker
computes that share of the time and rests the remainder (BOINC's "use at most X % of CPU time")."""

from __future__ import annotations

import time

import psutil
import pytest

from daemons import cli, start_daemon, stop_all, write_local_config
from p2ptrain.daemon.worker_process import recorded_group
from p2ptrain.paths import resolve_paths

SHARE = 0.2
WINDOW_S = 10.0


def cpu_seconds(process: psutil.Process) -> float:
    """The worker process's own CPU time (its threads; not the DHT's and averagers' child processes)."""
    times = process.cpu_times()
    return times.user + times.system


@pytest.mark.timeout(300)
def test_a_worker_at_a_fifth_of_the_time_computes_about_a_fifth_of_a_core(tmp_path):
    home = tmp_path / "laptop"
    write_local_config(home)
    daemon = start_daemon(home)
    try:
        refused = cli(home, "config", "set", "policy.max_compute_share", "0")
        assert refused.returncode != 0 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert cli(home, "config", "set", "policy.max_compute_share", str(SHARE)).returncode == 0
        created = cli(home, "join", "--new-run", "cool", "--mode", "sync", "--target-batch-size", "64", "--micro-batch", "8")
        assert created.returncode == 0, created.stderr
        status = daemon.wait_until(lambda s: s["state"] == "training" and ((s.get("local") or {}).get("samples_per_second") or 0) > 0,
                                   180, what="a step report")
        plan = status["local"]["plan"]
        assert plan["compute_share"] == SHARE
        assert any("max_compute_share" in line for line in plan["rationale"]), plan["rationale"]
        worker = psutil.Process(recorded_group(resolve_paths(home).worker_pgid_file)[0])
        before, started = cpu_seconds(worker), time.monotonic()
        time.sleep(WINDOW_S)
        used = (cpu_seconds(worker) - before) / (time.monotonic() - started)
        # one torch thread trains at about a whole core without the cap; at 0.2 it computes a fifth of the
        # time, plus the worker's own threads (progress, reports): well under half a core
        assert used < 0.5, f"the worker used {used:.2f} of a core at max_compute_share = {SHARE}"
        assert daemon.status()["state"] == "training"
    finally:
        stop_all([daemon])
