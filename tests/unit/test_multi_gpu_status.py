"""``status.local`` with one worker per GPU: the first worker's view, every
worker in ``local.workers``, totals summed; and ``p2ptrain status`` in words."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from p2ptrain.cli import format_status
from p2ptrain.control_types import Status, WorkerStatus
from p2ptrain.daemon.run_view import RunView
from p2ptrain.worker_pipe import Joined, Step, decode_report


def joined_report(peer_id: str, micro_batch: int, precision: str = "bf16") -> Joined:
    """A ``joined`` report as the worker sends it through the pipe."""
    return decode_report({
        "type": "joined", "peer_id": peer_id, "addresses": [f"/ip4/127.0.0.1/tcp/1/p2p/{peer_id}"], "reachability": "direct",
        "manifest": {"run_id": "r", "mode": "sync", "model": "gemma-2b", "target_batch_size": 512}, "manifest_hash": "h",
        "device": "cuda:0", "precision": precision, "quantization": "none", "micro_batch": micro_batch, "grad_accum": 16 // micro_batch,
        "parameters": 2_500_000_000, "trainable_parameters": 900_000, "nickname": "box",
    })


def step(samples: int, samples_per_second: float, loss: float, trained: int, contributed: int, late: int = 0) -> Step:
    """A ``step`` report: ``samples`` since the last one, and the worker's totals of the run."""
    return decode_report({"type": "step", "ts": 1.0, "epoch": 3, "loss": loss, "samples": samples, "samples_per_second": samples_per_second,
                          "trained_samples": trained, "contributed_samples": contributed,
                          "unused_samples": {"late": late, "failed_round": 0, "rejected": 0}})


def training_status(run: RunView) -> Status:
    """The status object of a daemon training in ``run``."""
    return Status(protocol=1, version="0.1.0", state="training", started_at=0.0, run=run.run_status(), local=run.local_status())


def two_workers_training() -> RunView:
    run = RunView(run_id="r")
    run.worker("gpu0", "cuda:0")
    run.worker("gpu1", "cuda:1")
    run.apply_joined("gpu0", joined_report("QmFirst", 8))
    run.apply_joined("gpu1", joined_report("QmSecond", 2, "fp16"))
    for name in ("gpu0", "gpu1"):
        run.states.move(name, run.workers[name], "training")
    run.apply_step("gpu0", step(80, 20.0, 2.5, trained=80, contributed=64))
    run.apply_step("gpu1", step(30, 6.5, 2.75, trained=30, contributed=16, late=8))
    run.apply_step("gpu0", step(40, 21.0, 2.25, trained=120, contributed=100))
    return run


def test_local_is_the_first_worker_with_every_worker_listed_and_totals_summed():
    local = two_workers_training().local_status()

    assert local.peer_id == "QmFirst" and local.device == "cuda:0" and local.micro_batch == 8
    assert local.loss == 2.25  # the first worker's latest
    assert local.samples_per_second == 27.5
    assert (local.trained_samples, local.contributed_samples, local.unused_samples["late"]) == (150, 116, 8)
    first, second = local.workers
    assert isinstance(first, WorkerStatus) and first.plan is None
    assert (second.device, second.peer_id, second.precision, second.micro_batch, second.grad_accum) == ("cuda:1", "QmSecond", "fp16", 2, 8)
    assert (second.samples_per_second, second.loss, second.trained_samples, second.contributed_samples, second.state) == (6.5, 2.75, 30, 16, "training")


def test_a_crashed_worker_counts_nothing_per_second_but_keeps_what_it_contributed():
    run = two_workers_training()
    run.workers["gpu1"].stopped()
    run.states.move("gpu1", run.workers["gpu1"], "restarting")

    local = run.local_status()

    assert local.samples_per_second == 21.0 and (local.trained_samples, local.contributed_samples) == (150, 116)
    assert local.workers[1].state == "restarting"
    assert run.joined  # the first still trains


def test_local_shows_a_joined_worker_while_the_first_is_still_joining():
    run = RunView(run_id="r")
    run.worker("gpu0", "cuda:0")
    run.worker("gpu1", "cuda:1")
    assert run.local_status() is None and not run.joined
    run.apply_joined("gpu1", joined_report("QmSecond", 2))
    assert run.local_status().peer_id == "QmSecond"
    assert [worker.state for worker in run.local_status().workers] == ["joining", "joining"]


def test_one_worker_keeps_the_single_worker_shape():
    run = RunView(run_id="r")
    run.worker("cpu", "cpu")
    run.apply_joined("cpu", replace(joined_report("QmOnly", 4), device="cpu"))
    run.apply_step("cpu", step(40, 3.0, 4.0, trained=40, contributed=32))

    local = run.local_status()

    assert (local.samples_per_second, local.contributed_samples, local.device) == (3.0, 32, "cpu")
    assert len(local.workers) == 1 and "state" not in local.SCHEMA, "the daemon's state is status.state"


def test_every_worker_is_marked_local_in_the_peer_table():
    run = two_workers_training()
    peers = run.apply_swarm(decode_report({
        "type": "swarm", "epoch": 3, "samples_accumulated": 0, "target_batch_size": 512, "eta_next_epoch_s": None, "num_peers": 3,
        "peers": [{"peer_id": "QmFirst"}, {"peer_id": "QmSecond"}, {"peer_id": "QmSomeoneElse"}]}))
    assert [peer.is_local for peer in peers] == [True, True, False]


def test_human_status_prints_one_line_per_worker_and_the_totals():
    run = two_workers_training()
    lines = format_status(training_status(run)).splitlines()

    workers = [line for line in lines if line.strip().startswith("Worker:")]
    assert len(workers) == 2
    assert "cuda:0" in workers[0] and "QmFirst" in workers[0] and "21.0 samples/s" in workers[0]
    assert "cuda:1" in workers[1] and "fp16" in workers[1] and "6.5 samples/s" in workers[1] and "QmSecond" in workers[1]
    assert not any(line.strip().startswith("Device:") for line in lines)
    training = next(line for line in lines if line.strip().startswith("Training:"))
    assert "27.5 samples/s in all" in training and "116 samples contributed in all" in training
    samples = next(line for line in lines if line.strip().startswith("Samples:"))
    assert samples.strip() == "Samples: 150 trained, 116 used by the run (77%), 8 not used (8 late), 26 in the current round (all workers)"


def test_human_status_of_one_worker_has_a_device_line_and_no_worker_lines():
    run = RunView(run_id="r")
    run.worker("gpu0", "cuda:0")
    run.apply_joined("gpu0", joined_report("QmOnly", 8))
    lines = format_status(training_status(run)).splitlines()

    assert any(line.strip().startswith("Device: cuda:0, bf16") for line in lines)
    assert not any("Worker:" in line or "in all" in line for line in lines)


def test_a_restarted_worker_that_lost_its_checkpoint_does_not_shrink_the_totals():
    run = two_workers_training()
    run.apply_step("gpu1", step(4, 6.0, 2.7, trained=4, contributed=0))
    assert run.local_status().workers[1].trained_samples == 30


def test_status_says_why_samples_wait_when_rounds_find_no_other_peer():
    run = RunView(run_id="r")
    run.worker("gpu0", "cuda:0")
    run.apply_joined("gpu0", joined_report("QmOnly", 8))
    waiting = "the last 1 averaging round found no other peer (they paused or left): this peer takes its outer steps alone"
    run.apply_step("gpu0", replace(step(40, 20.0, 2.5, trained=200, contributed=120), waiting=waiting))
    status = training_status(run)
    assert status.local.waiting == waiting
    samples = next(line for line in format_status(status).splitlines() if line.strip().startswith("Samples:"))
    assert samples.strip() == f"Samples: 200 trained, 120 used by the run (60%), 80 waiting: {waiting}"
    run.apply_step("gpu0", step(40, 20.0, 2.5, trained=240, contributed=240))
    assert run.local_status().waiting is None  # a round found the others again


def test_traffic_is_summed_over_the_workers_into_local_traffic():
    run = two_workers_training()
    for name, averaging in (("gpu0", 3000.0), ("gpu1", 1000.0)):
        run.apply_traffic(name, decode_report({
            "type": "traffic", "bytes_per_s": {"averaging": averaging, "dht": 100.0}, "sent_bytes_per_s": averaging / 2,
            "received_bytes_per_s": averaging / 2 + 100.0, "sent_bytes": 1e6, "received_bytes": 1e6, "since": 0.0,
            "totals": {"averaging": averaging * 60, "dht": 6000.0}, "totals_at": 60.0, "measured_at": "2026-11-15T12:00:00"}))

    traffic = run.traffic_status(0.25, datetime(2026, 11, 15, 12, 0))

    assert traffic.bytes_per_s == {"averaging": 4000.0, "dht": 200.0}
    assert traffic.totals == {"averaging": 240000.0, "dht": 12000.0}
    assert (traffic.sent_bytes_per_s, traffic.received_bytes_per_s, traffic.month_used_gb) == (2000.0, 2200.0, 0.25)
    assert traffic.month_gb > 0
    status = training_status(run)
    status.local.traffic = traffic
    assert Status.from_dict(status.to_dict()) == status, "what the daemon sends, the CLI reads back"
    assert "Traffic: 4.2 KB/s (averaging 4.0, dht 0.2)" in format_status(status)
