"""A slow volunteer in a DiLoCo swarm: the third of three real workers runs in a cgroup at 25 % of one core.

Rounds end on the swarm's samples (the default ``round_end``): the slow peer
takes part in averaged rounds and most of what it trained is used, and the
fast peers never wait longer than one matchmaking window.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cpu_quota  # noqa: E402  (tests/cpu_quota.py)
from test_worker_swarm import WorkerHandle, rounds_with_others, run_manifest, stop_all  # noqa: E402

pytestmark = pytest.mark.swarm

MATCHMAKING_TIME = 3.0  # WorkerHandle's averaging settings


def account_after_a_round(worker: WorkerHandle) -> dict:
    """The sample account of the last epoch report: what is pending then is only what the peer
    trained while that round was being averaged."""
    return worker.of_type("epoch")[-1]


@pytest.mark.timeout(240)
@pytest.mark.skipif(cpu_quota.unavailable() is not None, reason=cpu_quota.unavailable() or "")
def test_a_slow_peer_takes_part_in_rounds_and_its_work_is_used(tmp_path):
    manifest = run_manifest("slow-peer", mode="diloco", local_steps=10, target_batch_size=1600, inner_lr=2e-3,
                            outer_lr=1.0, outer_momentum=0.0)
    quota = cpu_quota.CpuQuota(0.25)
    workers: list[WorkerHandle] = []
    try:
        workers.append(WorkerHandle(tmp_path, "fast0", manifest, True, []))
        address = workers[0].joined()["addresses"][0]
        workers.append(WorkerHandle(tmp_path, "fast1", manifest, False, [address]))
        slow = WorkerHandle(tmp_path, "slow", manifest, False, [address])
        quota.add(slow.process.pid)  # before it imports torch: everything it starts inherits the quota
        workers.append(slow)
        for worker in workers[1:]:
            worker.joined()

        slow.wait_for(lambda w: rounds_with_others(w) >= 3, 150, "3 averaged rounds of the slow peer")
        for worker in workers:
            worker.drain()
        account = account_after_a_round(slow)
        assert account["trained_samples"] > 0
        assert account["contributed_samples"] >= 0.8 * account["trained_samples"], account
        assert sum(account["unused_samples"].values()) <= 0.1 * account["trained_samples"], account
        # on a busy machine the fast peers may get no more CPU than the slow one: the quota must at least have bitten
        assert quota.throttled_periods() > 0, "the CPU quota never held the slow peer back"
        # honest peers of unequal speed name nobody: a fast peer's pseudo-gradient holds more inner
        # steps than a slow one's, within the bound its weight (its samples) gives it in robust_reduce
        assert [event["message"] for worker in workers for event in worker.events("suspect-peer")] == []
        for worker in workers[:2]:
            longest = max(report["longest_idle_s"] for report in worker.of_type("step"))
            # a step on this shared machine can take a while; a stop-and-wait for the slow peer would take many windows
            assert longest <= MATCHMAKING_TIME + 1.0, f"{worker.spec['nickname']} waited {longest:.1f} s between steps"
    finally:
        stop_all(workers)
        quota.remove()
