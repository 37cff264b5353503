"""The daemon <-> worker pipe: every message survives the trip, anything else is refused
in one line, and both ends handle every kind the pipe module defines."""

from __future__ import annotations

import dataclasses
import inspect
import logging
import multiprocessing
import pickle

import pytest

from p2ptrain import protocol
from p2ptrain.daemon.reports import WorkerReports
from p2ptrain.daemon.worker_process import received_reports
from p2ptrain.peers.swarm.records import LocalMetrics
from p2ptrain.peers.worker.command_inbox import CommandInbox
from p2ptrain.peers.worker.training_worker import Worker
from p2ptrain.storage.schema import PEER_COLUMNS
from p2ptrain.worker_pipe import (
    COMMANDS,
    REPORTS,
    AveragingTimings,
    Epoch,
    Error,
    Event,
    Finish,
    Joined,
    Leave,
    Left,
    MalformedMessage,
    Network,
    Pause,
    PeerRow,
    PlanWanted,
    Resume,
    StateChanged,
    Step,
    Swarm,
    Traffic,
    Unban,
    UsePlan,
    WorkerPaths,
    WorkerPlan,
    WorkerSpec,
    decode_command,
    decode_report,
    encode,
)

ONE_OF_EACH_REPORT = [
    PlanWanted(manifest={"run_id": "r", "model": "tiny", "seq_len": 128}),
    Joined(peer_id="QmA", nickname="box", addresses=["/ip4/127.0.0.1/tcp/1/p2p/QmA"], reachability="direct",
           device="cpu", precision="fp32", quantization="none", micro_batch=4, grad_accum=2, parameters=10,
           trainable_parameters=5, manifest={"run_id": "r", "lora": None}, manifest_hash="h"),
    Network(reachability="relayed", addresses=["/ip4/127.0.0.1/tcp/1/p2p/QmA"], checked_at=2.0, asked=2, answered=1,
            reached=["/ip4/127.0.0.1/tcp/1/p2p/QmA"], averaging_client=True),
    Traffic(bytes_per_s={"averaging": 10.0, "dht": 2.5}, totals={"averaging": 600.0, "other": -4.0}, totals_at=2.0,
            sent_bytes_per_s=6.0, received_bytes_per_s=6.5,
            sent_bytes=600.0, received_bytes=650.0, since=1.0, measured_at="kernel"),
    Step(ts=1.5, epoch=2, loss=None, samples=8, samples_per_second=4.0),
    Epoch(epoch=2, started_at=1.0, ended_at=3.0, duration_s=2.0, num_peers=2, global_samples=64, loss=2.5, val_loss=2.6, averaged_with=2),
    Swarm(epoch=2, samples_accumulated=10, target_batch_size=64, eta_next_epoch_s=None, num_peers=2,
          peers=[PeerRow(peer_id="QmA", loss=2.5, compatible=True), PeerRow(peer_id="QmB", reachability="relayed")]),
    StateChanged(state="finished"),
    Event(kind="checkpoint-saved", message="checkpoint saved", data={"epoch": 2}),
    Error(message="out of memory", fix="smaller", out_of_memory=True),
    Left(),
]


def test_every_report_kind_survives_the_pipe():
    assert {type(report) for report in ONE_OF_EACH_REPORT} == set(REPORTS.values())
    for report in ONE_OF_EACH_REPORT:
        sent = encode(report)
        # what a multiprocessing pipe does to it
        received = pickle.loads(pickle.dumps(sent))
        assert received["type"] == report.KIND
        assert decode_report(received) == report


def test_every_command_survives_the_pipe():
    sent = [
        (Pause(), {"cmd": "pause"}),
        (Resume(), {"cmd": "resume"}),
        (Finish(), {"cmd": "finish"}),
        (Leave(), {"cmd": "leave"}),
        (Unban(peers=["QmRogue"]), {"cmd": "unban", "peers": ["QmRogue"]}),
        (Unban(), {"cmd": "unban", "peers": None}),
        (UsePlan(WorkerPlan(device="cuda:0", precision="fp16", micro_batch=4, grad_accum=2, gradient_checkpointing=True,
                            memory_cap_bytes=3 << 30)), None),
        (UsePlan(failure="llama-2-7b does not fit", fix="use a smaller model"), None),
    ]
    for command, wire in sent:
        assert wire is None or encode(command) == wire
        assert decode_command(pickle.loads(pickle.dumps(encode(command)))) == command
    assert set(COMMANDS.values()) == {type(command) for command, _ in sent}


def test_a_command_with_a_field_of_the_wrong_type_is_refused():
    with pytest.raises(MalformedMessage, match="unban command: peers must be"):
        decode_command({"cmd": "unban", "peers": "QmRogue"})


def test_a_spec_survives_the_trip_to_a_spawned_worker():
    spec = WorkerSpec(
        run_id="r", paths=WorkerPaths("s", "c", "k", "i"), manifest={"run_id": "r"}, initial_peers=["/ip4/1.2.3.4/tcp/1"],
        plan=WorkerPlan(device="cuda:0", precision="bf16", micro_batch=8, grad_accum=2, cpu_threads=4),
        environment={"CUDA_VISIBLE_DEVICES": "1"}, averaging=AveragingTimings(3.0, 20.0),
    )
    assert WorkerSpec.from_dict(pickle.loads(pickle.dumps(spec.to_dict()))) == spec


@pytest.mark.parametrize(
    ("received", "complaint"),
    [
        ("joined", "must be a dict"),
        ({"type": "dance"}, "unknown worker report type='dance'"),
        ({"kind": "step"}, "unknown worker report type=None"),
        ({"type": "step", "ts": "now", "epoch": 1, "loss": 1.0, "samples": 1, "samples_per_second": 1.0}, "ts must be float"),
        ({"type": "step", "ts": 1.0, "epoch": True, "loss": 1.0, "samples": 1, "samples_per_second": 1.0}, "epoch must be int"),
        ({"type": "step", "ts": 1.0, "epoch": 1, "loss": 1.0, "samples": 1}, "has no samples_per_second"),
        ({"type": "step", "ts": 1.0, "epoch": 1, "loss": 1.0, "samples": 1, "samples_per_second": 1.0, "speed": 2}, "has no field speed"),
        ({"type": "state", "state": "dancing"}, "state must be one of 'training', 'paused', 'finished'"),
        ({"type": "event", "kind": "x", "message": "m", "data": ["not", "a", "dict"]}, "data must be dict"),
        ({"type": "swarm", "epoch": 1, "samples_accumulated": 0, "target_batch_size": 8, "eta_next_epoch_s": None,
          "num_peers": 1, "peers": [{"nickname": "no id"}]}, "peers[0] has no peer_id"),
    ],
)
def test_a_malformed_report_is_refused_in_one_line(received, complaint):
    with pytest.raises(MalformedMessage) as refused:
        decode_report(received)
    assert complaint in str(refused.value) and "\n" not in str(refused.value)


def test_an_unknown_command_is_refused():
    with pytest.raises(MalformedMessage, match="unknown worker command cmd='dance'"):
        decode_command({"cmd": "dance"})


def test_the_daemon_has_a_handler_for_every_report_kind():
    handlers = WorkerReports(run=None, db=None, broadcaster=None, events=None, control=None, pool=None).handlers
    assert set(handlers) == set(REPORTS.values())


def test_the_worker_has_a_handler_for_every_command_taking_its_fields():
    spec = WorkerSpec(run_id="r", paths=WorkerPaths("s", "c", "k", "i"))
    handlers = Worker(None, spec, pgid=0).command_handlers
    assert set(handlers) == set(COMMANDS.values())
    for command, handler in handlers.items():
        fields = [field.name for field in dataclasses.fields(command)]
        assert list(inspect.signature(handler).parameters) == fields, f"{handler.__name__} must take {command.__name__}'s fields {fields}"


def test_the_daemon_serves_every_protocol_method_but_subscribe_from_its_table():
    from p2ptrain.daemon.methods import ControlMethods

    methods = ControlMethods(status=dict, control=None, run=None, db=None, config=None, event_log=None)
    handlers = methods.handlers()
    assert set(handlers) == set(protocol.METHODS) - {"subscribe"}
    assert all(inspect.iscoroutinefunction(handler) for handler in handlers.values()), handlers


def test_a_peer_row_holds_every_field_of_a_metrics_record_and_of_the_peers_table():
    row_fields = set(PeerRow.SCHEMA)
    assert set(LocalMetrics.model_fields) - {"time"} <= row_fields, "add the metrics record's new field to PeerRow"
    assert set(PEER_COLUMNS) <= row_fields, "add the peers table's new column to PeerRow"


def test_the_daemon_logs_and_drops_what_a_broken_worker_sends_and_reads_on(caplog):
    daemon_end, worker_end = multiprocessing.Pipe()
    worker_end.send({"type": "step", "ts": "soon"})
    worker_end.send_bytes(b"not a pickle at all")
    worker_end.send(["not", "a", "report"])
    worker_end.send(encode(Left()))
    with caplog.at_level(logging.WARNING):
        assert list(received_reports(daemon_end, "gpu1")) == [Left()]
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 3 and all(line.startswith("ignoring a report of worker gpu1: ") for line in warnings), warnings
    assert "step report: ts must be float, not 'soon'" in warnings[0]


def test_the_worker_answers_an_unknown_command_with_an_error_and_reads_on():
    daemon_end, worker_end = multiprocessing.Pipe()
    worker = Worker(worker_end, WorkerSpec(run_id="r", paths=WorkerPaths("s", "c", "k", "i")), pgid=0)
    worker.inbox = CommandInbox(worker_end, worker._command_arrived, worker._unknown_command)  # as its loop's start does
    worker.inbox.start()
    daemon_end.send({"cmd": "dance"})
    daemon_end.send(encode(Pause()))
    assert daemon_end.poll(10), "no answer to an unknown command"
    answer = decode_report(daemon_end.recv())
    assert isinstance(answer, Error) and not answer.fatal and "unknown worker command {'cmd': 'dance'}" in answer.message
    worker.inbox.wait(10)
    assert worker.inbox.take() == [Pause()]
