"""A DiLoCo peer whose only partner pauses: its work is used again within a few rounds.

On a real GPU a peer whose only partner paused trained 1,616 samples in 50 s of which the
run used none, its epoch stuck: it kept looking for a group the partner's progress record
promised. Here two real workers train (rounds on the swarm's samples, the default); one
pauses (it checkpoints, leaves the swarm and exits, as the daemon's pause does), and the
other must take outer steps alone, so that what it trains is contributed again.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from p2ptrain.peers.training.diloco import ALONE_AFTER_ROUNDS_WITHOUT_GROUP  # noqa: E402
from test_worker_swarm import rounds_with_others, run_manifest, start_swarm, stop_all  # noqa: E402

pytestmark = pytest.mark.swarm


@pytest.mark.timeout(300)
@pytest.mark.parametrize("partner_goes", ["pauses", "is killed"])
def test_a_peer_whose_partner_paused_steps_alone_and_its_work_is_used(tmp_path, partner_goes):
    manifest = run_manifest("lone-peer", mode="diloco", local_steps=10, target_batch_size=160, inner_lr=2e-3,
                            outer_lr=1.0, outer_momentum=0.0)
    workers = start_swarm(tmp_path, manifest, 2)
    try:
        stays, goes = workers
        for worker in workers:
            worker.wait_for(lambda w: rounds_with_others(w) >= 2, 150, "two rounds averaged together")
        if partner_goes == "pauses":
            goes.send("pause")
            goes.wait_for(lambda w: any(r["state"] == "paused" for r in w.of_type("state")), 60, "the partner to pause")
        else:  # no goodbye: its progress record stays in the DHT until it expires
            goes.kill_group()
        stays.drain()
        gone_at, since = time.monotonic(), len(stays.reports)
        epoch_at_pause, at_pause = stays.epoch(), stays.of_type("step")[-1]
        stays.wait_for(lambda w: w.epoch() >= epoch_at_pause + 3, 120, "three outer steps alone")
        print(f"\nthree outer steps alone {time.monotonic() - gone_at:.0f} s after the partner {partner_goes}")
        after = stays.reports[since:]
        first_alone = next(index for index, report in enumerate(after) if report["type"] == "epoch")
        failed = sum(report["data"]["rounds"] for report in after[:first_alone]
                     if report["type"] == "event" and report["kind"] == "averaging-failed")
        # a bounded wait: it steps alone after ALONE_AFTER_ROUNDS_WITHOUT_GROUP rounds that found nobody,
        # one more when a round was under way as the partner went
        assert failed <= ALONE_AFTER_ROUNDS_WITHOUT_GROUP + 1, after[:first_alone]
        if partner_goes == "is killed":  # its record stays: while rounds find nobody, the step reports say
            # why the samples wait (status.local.waiting); a paused partner's record goes at once
            assert any("found no other peer" in (report.get("waiting") or "") for report in after[:first_alone] if report["type"] == "step")
        last = stays.of_type("step")[-1]
        # its work is used again: most of what it trained since the partner went entered its outer steps
        used = last["contributed_samples"] - at_pause["contributed_samples"]
        trained = last["trained_samples"] - at_pause["trained_samples"]
        assert used >= 0.5 * trained, (at_pause, last)
    finally:
        stop_all(workers)
