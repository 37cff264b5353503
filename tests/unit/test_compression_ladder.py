"""The compression ladder: rung names, which rungs a run allows, and the rung a peer picks from its uplink."""

import subprocess
import sys

import pytest
import torch

from p2ptrain.daemon.model_facts import model_facts
from p2ptrain.daemon.plan import DeviceFacts, choose_compression, make_plan
from p2ptrain.daemon.plan_command import parse_rate_mbit
from p2ptrain.peers.compression.ladder import (
    LADDER,
    RungNotAllowed,
    allowed_rungs,
    parse_rung,
    round_upload_seconds,
    rung_for_peer,
    upload_bytes_per_value,
)
from p2ptrain.peers.swarm.manifest import ManifestError, new_manifest
from p2ptrain.peers.worker.run_setup import WorkerFailure, make_trainer
from p2ptrain.worker_pipe import WorkerPaths, WorkerPlan, WorkerSpec

CPU = DeviceFacts(kind="cpu", name="a CPU", memory_total_mib=32768, memory_free_mib=20000, cpu_cores=8)
ONE_B = 1_100_048_384  # tinyllama-1.1b, full training


def test_the_ladder_goes_from_most_to_fewest_bytes():
    uploads = [upload_bytes_per_value(parse_rung(name)) for name in LADDER]
    assert uploads == sorted(uploads, reverse=True)
    assert uploads[0] == 6.0, "fp32 all-reduce: 2 * 3/4 * 4 bytes a value in a 4-peer round"
    assert 0.098 < upload_bytes_per_value(parse_rung("sparse2bit-64of4096")) < 0.1


@pytest.mark.parametrize("name", ["sparse3bit-64of4096", "sparse2bit-64of4000", "sparse2bit-2000of4096",
                                  "sparse2bit-0of4096", "sparse2bit-8of32", "zip", "8bit"])
def test_names_that_are_no_rung_are_refused_with_the_forms_that_are(name):
    with pytest.raises(ValueError, match=r"unknown compression .*; use none, fp16, .*sparse<bits>bit-<k>of<chunk>"):
        parse_rung(name)


def test_a_run_allows_its_top_rung_and_cheaper_ones_only():
    rungs = allowed_rungs("blockwise8bit", ["sparse2bit-16of4096"])
    assert [rung.name for rung in rungs] == ["blockwise8bit", "sparse2bit-16of4096"]
    with pytest.raises(ValueError, match="'fp16', which sends more than the run's compression 'blockwise8bit'"):
        allowed_rungs("blockwise8bit", ["fp16"])


def test_a_peer_on_a_rung_the_manifest_forbids_is_refused_with_what_it_allows():
    allowed = allowed_rungs("sparse2bit-64of4096")
    with pytest.raises(RungNotAllowed) as refused:
        rung_for_peer("sparse4bit-64of4096", allowed)
    assert refused.value.message == ("compression sparse4bit-64of4096 is not allowed by this run's manifest "
                                     "(it allows sparse2bit-64of4096)")
    assert "remove the compression override" in refused.value.fix
    assert rung_for_peer("sparse2bit-64of4096", allowed).k == 64


def test_a_worker_whose_plan_changed_to_a_forbidden_rung_fails_before_joining_any_round():
    """The worker's trainer refuses the rung before it starts an averager: the daemon shows the
    error and its fix (other peers' reducers would refuse what it sends)."""
    manifest = new_manifest("fixed-rung", mode="diloco", compression="sparse2bit-64of4096")
    plan = WorkerPlan(compression="fp16")
    spec = WorkerSpec(run_id="fixed-rung", paths=WorkerPaths("state", "cache", "checkpoints", "identity.key"), plan=plan)
    with pytest.raises(WorkerFailure) as failure:
        make_trainer(spec, plan, manifest, dht=None, parameters=[torch.nn.Parameter(torch.zeros(4))], batch_size_per_step=4)
    assert failure.value.message == "compression fp16 is not allowed by this run's manifest (it allows sparse2bit-64of4096)"


def test_the_manifest_refuses_sparse_rungs_outside_diloco_and_rungs_above_the_top():
    with pytest.raises(ManifestError, match="only mode 'diloco' has"):
        new_manifest("sync-sparse", compression="sparse2bit-64of4096")
    with pytest.raises(ManifestError, match="sends more than the run's compression"):
        new_manifest("upside-down", mode="diloco", compression="sparse2bit-64of4096", compression_rungs=["fp16"])
    manifest = new_manifest("ladder", mode="diloco", compression="fp16", compression_rungs=["sparse2bit-16of4096"])
    assert manifest.compression_rungs == ["sparse2bit-16of4096"] and manifest.error_feedback_decay == 1.0


@pytest.mark.parametrize(("uplink", "expected"), [
    (10_000.0, "fp16"),  # 2.6 s a round at 10 Gbit/s
    (100.0, "sparse4bit-64of4096"),  # blockwise8bit would take 133 s, sparse4bit-256of4096 30.5 s
    (20.0, "sparse2bit-16of4096"),  # sparse2bit-64of4096 would take 43.5 s
    (1.0, "sparse2bit-4of4096"),  # the cheapest, even over the budget
    (None, "fp16"),  # unknown uplink: the run's top rung
])
def test_the_plan_picks_the_most_precise_rung_the_uplink_sends_within_the_budget(uplink, expected):
    manifest = {"compression": "fp16", "compression_rungs": list(LADDER[2:])}
    name, reason = choose_compression(manifest, ONE_B, uplink)
    assert name == expected
    assert reason.startswith(f"compression {expected}: ")
    if uplink:
        seconds = round_upload_seconds(parse_rung(name), ONE_B, uplink)
        assert f"{uplink:g} Mbit/s up: {expected} uploads {seconds:.3g} s a round" in reason


def test_a_peer_never_sends_more_than_the_manifest_says_however_fast_its_uplink():
    name, reason = choose_compression({"compression": "sparse2bit-64of4096"}, ONE_B, 100_000.0)
    assert name == "sparse2bit-64of4096"
    assert "the only rung the run allows" in reason


def test_make_plan_adds_the_rung_and_its_reason_when_it_has_the_manifest():
    facts = model_facts("tiny", None)
    manifest = {"seq_len": 64, "micro_batch_hint": 4, "mode": "diloco", "compression": "blockwise8bit",
                "compression_rungs": ["sparse2bit-16of4096"]}
    slow = make_plan(facts, manifest, DeviceFacts(**{**CPU.__dict__, "uplink_mbit_s": 0.1}))
    assert slow.compression == "sparse2bit-16of4096"
    assert slow.rationale[-1].startswith("compression sparse2bit-16of4096: blockwise8bit would take")
    assert make_plan(facts, {"seq_len": 64}, CPU).compression is None, "no manifest, no rung"
    assert make_plan(facts, {**manifest, "mode": "sync", "compression_rungs": []}, CPU).compression is None, \
        "sync mode sends the manifest's compression"


@pytest.mark.parametrize(("text", "mbit"), [("20Mbit", 20.0), ("20 Mbit/s", 20.0), ("1Gbit", 1000.0),
                                            ("512kbit", 0.512), ("12.5", 12.5), ("100mbps", 100.0)])
def test_uplinks_parse(text, mbit):
    assert parse_rate_mbit(text) == pytest.approx(mbit)


def test_plan_command_shows_the_rung_for_an_uplink_and_refuses_a_bad_one():
    command = [sys.executable, "-m", "p2ptrain.cli", "plan", "--model", "tinyllama-1.1b", "--gpu-memory", "80GiB",
               "--compute-capability", "8.0", "--full-training", "--uplink"]
    shown = subprocess.run(command + ["20Mbit"], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "- compression sparse2bit-16of4096: sparse2bit-64of4096 would take 43.5 s, over the 30 s budget" in shown.stdout
    refused = subprocess.run(command + ["fast"], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2
    assert refused.stderr.strip() == ("p2ptrain plan: cannot read the uplink 'fast'; write it like 20Mbit, 512kbit or "
                                      "1Gbit (bits per second)")
