"""A state download that hivemind's step makes is reported, though it moves the epoch by only one.

Two real sync trainers (hivemind DHTs on 127.0.0.1, one process). A is one
epoch ahead; B's next step sees it (hivemind checks once an epoch that a peer
is on the swarm's epoch exactly) and downloads A's state instead of taking part
in a round. The outcome said so only when the epoch moved by two or more, so a
peer one epoch behind skipped a round with no ``state-downloaded`` event and no
reason in the scale lab's counts (8 peers: rounds missed without a failure).
"""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch

from sync_trainers import sync_pair

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(120)]


def test_a_peer_one_epoch_behind_reports_the_download_its_step_made():
    with sync_pair("download-in-step") as (ahead, behind, first):
        ahead.optimizer.state_averager.local_epoch = 1  # as after a round the other peer was not in
        ahead.optimizer.state_averager.state_sharing_priority = 1
        ahead.tracker.report_local_progress(1, 0)
        # what B's tracker reads once A's record reaches it (set here: its next read could be 30 s away)
        behind.tracker.global_progress = dataclasses.replace(behind.tracker.global_progress, epoch=1, num_peers=2)
        behind.tracker.fetched_global_progress_this_epoch.set()
        behind.parameters[0].grad = torch.ones(8)
        outcome = behind.step(8)
        assert behind.local_epoch == 1 and behind.state_source == first.peer_id.to_base58()
        assert outcome.loaded_state, "a download inside the step went unreported"
        assert not behind.tick().loaded_state  # reported once


def test_a_download_does_not_wait_for_a_round_that_found_no_group():
    """hivemind tags along in the pre-scheduled gradient round before a download and waits for it to end:
    one still looking for its group (scheduled for the round the swarm finished without this peer) held
    a first join's download 66 s in the 16-peer lab, until the swarm's next group formed; here, until the
    averaging timeout. Now such a round is cancelled and the download starts at once."""
    with sync_pair("download-no-group", averaging_timeout=120.0) as (ahead, behind, _):
        ahead.optimizer.state_averager.local_epoch = 1
        ahead.optimizer.state_averager.state_sharing_priority = 1
        ahead.tracker.report_local_progress(1, 0)
        behind.optimizer.scheduled_grads = behind.optimizer.grad_averager.schedule_step(timeout=120.0)  # nobody else looks
        started = time.monotonic()
        behind.load_state_from_peers()
        assert behind.local_epoch == 1
        assert time.monotonic() - started < 60, "the download waited for the round's averaging timeout"
