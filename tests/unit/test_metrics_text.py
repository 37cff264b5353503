"""The OpenMetrics text of the daemon and the run monitor, read back by prometheus_client's parser,
and what the monitor keeps of a run (``monitor/history.py``)."""

from __future__ import annotations

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from p2ptrain.daemon.metrics_endpoint import daemon_metrics
from p2ptrain.monitor.history import RunHistory
from p2ptrain.monitor.run_metrics import monitor_metrics
from p2ptrain.openmetrics import OpenMetricsText
from p2ptrain.worker_pipe import PeerRow, Swarm


def parsed(text: str) -> dict:
    return {family.name: family for family in text_string_to_metric_families(text)}


def test_label_values_with_quotes_backslashes_and_newlines_come_back_as_they_were():
    text = OpenMetricsText()
    nickname = 'a "quoted"\\ name\nover two lines'
    text.add("p2ptrain_peer", "info", "a peer", 1, peer="Qm1", nickname=nickname)
    text.add("p2ptrain_peer_loss", "gauge", "loss", None, peer="Qm1")  # unknown: left out, not 0
    text.add("p2ptrain_peer_trained_samples", "counter", "samples", 12, peer="Qm1")
    families = parsed(text.render())
    assert families["p2ptrain_peer"].samples[0].labels["nickname"] == nickname
    assert "p2ptrain_peer_loss" not in families
    assert families["p2ptrain_peer_trained_samples"].samples[0].name == "p2ptrain_peer_trained_samples_total"


def test_a_family_cannot_change_its_type():
    text = OpenMetricsText()
    text.add("p2ptrain_run_epoch", "gauge", "epoch", 1)
    with pytest.raises(ValueError, match="is a gauge"):
        text.add("p2ptrain_run_epoch", "counter", "epoch", 1)


STATUS = {
    "version": "0.1.0", "state": "paused", "pause_reason": "gpu-busy", "started_at": 1.7e9,
    "run": {"id": "r", "mode": "diloco", "model": "tiny", "manifest_hash": "abc", "epoch": 4, "samples_accumulated": 10,
            "target_batch_size": 512, "eta_next_epoch_s": None, "num_peers": 2, "last_epoch_at": 1.7e9 + 60},
    "local": {"samples_per_second": 0.0, "loss": 2.5, "trained_samples": 300, "contributed_samples": 250,
              "unused_samples": {"late": 10, "failed_round": 0, "rejected": 1},
              "workers": [{"device": "cuda:0", "samples_per_second": 0.0, "micro_batch": 4}],
              "traffic": {"bytes_per_s": {"averaging": 100.0, "dht": 5.0}, "month_used_gb": 1.5}},
    "hardware": {"gpus": [{"index": 0, "name": "RTX 4090", "memory_used_mib": 1024, "memory_total_mib": 24564,
                           "utilization_pct": 97, "temperature_c": 70, "power_w": 300.5}]},
    "health": [{"level": "warning", "message": "m", "fix": "f"}],
}


def test_the_daemons_metrics_say_its_state_contribution_gpus_and_run():
    peers = {"peers": [{"peer_id": "Qm1", "nickname": "me", "device": "cuda:0", "samples_per_second": 0.0,
                        "trained_samples": 300, "contributed_samples": 250, "last_seen": 1.7e9, "compatible": True}],
             "bans": [{"peer_id": "QmBad"}]}
    families = parsed(daemon_metrics(STATUS, peers))
    states = {sample.labels["p2ptrain_daemon_state"]: sample.value for sample in families["p2ptrain_daemon_state"].samples}
    assert states["paused"] == 1 and sum(states.values()) == 1
    reasons = {sample.labels["p2ptrain_daemon_pause_reason"]: sample.value for sample in families["p2ptrain_daemon_pause_reason"].samples}
    assert reasons["gpu-busy"] == 1 and sum(reasons.values()) == 1
    assert {sample.labels["reason"]: sample.value for sample in families["p2ptrain_local_unused_samples"].samples}["late"] == 10
    assert families["p2ptrain_gpu_memory_used_bytes"].samples[0].value == 1024 * 1024 * 1024
    assert families["p2ptrain_gpu_utilization_ratio"].samples[0].value == pytest.approx(0.97)
    assert families["p2ptrain_traffic_month_bytes"].samples[0].value == 1.5e9
    assert families["p2ptrain_run_banned_peers"].samples[0].value == 1
    assert families["p2ptrain_run_epoch"].samples[0].value == 4
    assert "p2ptrain_run_eta_next_epoch_seconds" not in families
    assert families["p2ptrain_daemon_health_problems"].samples[1].value == 1


def test_an_idle_daemon_has_no_run_families():
    families = parsed(daemon_metrics({"state": "idle", "version": "0.1.0", "run": None, "local": None, "hardware": None}, {}))
    assert "p2ptrain_run" not in families and "p2ptrain_local_loss" not in families
    assert families["p2ptrain_daemon"].samples[0].labels["version"] == "0.1.0"


def row(peer_id: str, loss: float | None, seen: float, nickname: str = "") -> PeerRow:
    return PeerRow(peer_id=peer_id, nickname=nickname or peer_id, device="cpu", precision="fp32", quantization="none",
                   samples_per_second=10.0, loss=loss, epoch=1, trained_samples=100, contributed_samples=90,
                   manifest_hash="abc", compatible=True, reachability="direct", version="0.1.0", last_seen=seen)


def swarm(epoch: int, *rows: PeerRow) -> Swarm:
    return Swarm(epoch=epoch, samples_accumulated=5, target_batch_size=64, eta_next_epoch_s=3.0, num_peers=len(rows), peers=list(rows))


def test_the_history_keeps_one_loss_point_per_record_and_the_epochs_it_saw_begin():
    history = RunHistory({"id": "r", "mode": "sync", "model": "tiny", "manifest_hash": "abc", "target_batch_size": 64})
    history.add(swarm(1, row("A", None, 100), row("B", 3.0, 100)), at=101)
    history.add(swarm(1, row("A", 4.0, 130), row("B", 3.0, 100)), at=131)  # B's record is the same: no new point
    history.add(swarm(2, row("A", 3.5, 160)), at=161)  # B's record expired
    run = history.to_json()
    assert run["series"]["loss"] == {"A": [[130, 4.0], [160, 3.5]], "B": [[100, 3.0]]}
    assert run["epochs"] == [{"epoch": 2, "at": 161, "peers": 1}] and run["run"]["last_epoch_at"] == 161
    assert [(peer["peer_id"], peer["present"]) for peer in run["peers"]] == [("A", True), ("B", False)]
    assert run["peers"][1]["first_seen"] == 101
    assert run["run"]["samples_per_second"] == 10.0 and run["run"]["num_peers"] == 1
    families = parsed(monitor_metrics(run))
    assert [sample.labels["peer"] for sample in families["p2ptrain_peer"].samples] == ["A"]  # gone peers end their series
    assert families["p2ptrain_monitor_reads"].samples[0].value == 3


def test_a_failed_read_is_counted_and_shown_until_the_next_one_succeeds():
    history = RunHistory({"id": "r"})
    history.failed("TimeoutError: no answer", at=10)
    assert history.to_json()["reads"] == {"count": 0, "failed": 1, "last_error": "TimeoutError: no answer", "at": 10}
    history.add(swarm(0, row("A", 1.0, 11)), at=12)
    assert history.to_json()["reads"]["last_error"] is None


def test_the_history_shows_each_rounds_group_sizes_and_who_bans_whom():
    history = RunHistory({"id": "r"})
    a, b, c = row("A", 3.0, 100), row("B", 3.0, 100), row("C", 3.0, 100)
    a.last_group, b.last_group, c.last_group = 3, 2, 0  # C has not averaged yet
    b.bans = ["C", "Z"]
    history.add(swarm(1, a, b, c), at=101)
    b2 = row("B", 2.9, 130)
    b2.epoch, b2.last_group, b2.bans = 2, 3, ["C"]
    history.add(swarm(2, a, b2, c), at=131)
    run = history.to_json()
    assert run["rounds"] == [{"epoch": 1, "groups": {"A": 3, "B": 2}}, {"epoch": 2, "groups": {"B": 3}}]
    assert run["bans"] == [{"peer_id": "C", "nickname": "C", "by": ["B"]}]  # Z: only the record B replaced named it
    families = parsed(monitor_metrics(run))
    by_peer = {sample.labels["peer"]: sample.value for sample in families["p2ptrain_peer_last_group_size"].samples}
    assert by_peer == {"A": 3, "B": 3}  # C's 0 is "not yet", left out
    assert {sample.labels["peer"]: sample.value for sample in families["p2ptrain_peer_bans"].samples} == {"A": 0, "B": 1, "C": 0}
