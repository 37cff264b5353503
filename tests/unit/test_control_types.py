"""The control protocol's records (``p2ptrain/control_types.py``): what the daemon sends, its clients read
back unchanged; a reply that is not what the protocol says is one line naming the field; the CLI stays light."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from p2ptrain import cli, control_types
from p2ptrain.control_types import (
    Ban, Cpu, EventRow, EventsResult, Gpu, GpuProcess, Hardware, Health, JoinResult, LocalStatus, MalformedReply,
    PeerRow, PeersResult, PeersUpdate, Plan, Push, Ram, Record, RunStatus, Status, TrafficStatus, UnbanResult, WorkerStatus,
    decode_push,
)
from p2ptrain.pipe_codec import MalformedMessage
from p2ptrain.protocol import ControlClient
from p2ptrain.worker_pipe import decode_report


def plan() -> Plan:
    return Plan(model="tiny", device="cuda:0", device_name="Tesla T4", precision="fp16", quantization="none", micro_batch=8,
                grad_accum=4, cpu_threads=2, seq_len=128, memory_estimate_gib=0.66, memory_allowed_gib=13.5,
                gradient_checkpointing=False, memory_cap_gib=13.0, rationale=["precision fp16: compute capability 7.5"],
                compression=None, samples_per_second=None, calibrated=False, samples_per_step=32)


def training_status() -> Status:
    worker = WorkerStatus(device="cuda:0", peer_id="QmMine", precision="fp16", quantization="none",
                          gradient_checkpointing=False, micro_batch=8, grad_accum=4, samples_per_second=41.5, loss=2.5,
                          trained_samples=1000, contributed_samples=960, unused_samples={"late": 40}, state="training",
                          plan=plan())
    local = LocalStatus(peer_id="QmMine", nickname="amber-fox", addresses=["/ip4/127.0.0.1/tcp/1/p2p/QmMine"],
                        reachability="direct", device="cuda:0", precision="fp16", quantization="none", micro_batch=8,
                        grad_accum=4, parameters=800_000, trainable_parameters=800_000, samples_per_second=41.5, loss=2.5,
                        trained_samples=1000, contributed_samples=960, unused_samples={"late": 40}, plan=plan(),
                        workers=[worker],
                        traffic=TrafficStatus(bytes_per_s={"averaging": 1200.0, "dht": 80}, sent_bytes_per_s=700.0,
                                        received_bytes_per_s=580.0, month_gb=3.3, month_used_gb=0.25,
                                        measured_at="2026-11-27T03:00:00"))
    hardware = Hardware(gpus=[Gpu(index=0, name="Tesla T4", uuid="GPU-1", memory_total_mib=15360, memory_used_mib=900,
                                  memory_free_mib=14460, compute_capability="7.5", utilization_pct=97,
                                  processes=[GpuProcess(pid=7, name="python", kinds=["compute"], used_memory_mib=880)])],
                        cpu=Cpu(model="Xeon", cores_physical=4, cores_logical=8), ram=Ram(total_mib=32000, available_mib=20000),
                        driver_version="550.54")
    run = RunStatus(id="tiny-demo", mode="sync", model="tiny", manifest_hash="9f2c", epoch=4, samples_accumulated=96,
                    target_batch_size=256, eta_next_epoch_s=12.0, num_peers=3)
    return Status(protocol=1, version="0.1.0", state="training", since=1000.0, started_at=900.0, run=run, local=local,
                  hardware=hardware, health=[Health(level="warning", message="port 31337 was taken", fix="free it")])


def every_reply() -> list[Record]:
    """One of each reply the protocol types, together holding a record of every class."""
    peers = [PeerRow(peer_id="QmMine", loss=2.5, epoch=4, compatible=True, bans=["QmRogue"], is_local=True),
             PeerRow(peer_id="QmRogue", banned=True)]
    bans = [Ban(peer_id="QmRogue", banned_at=1000.0, reason="named in 3 rounds", rounds_named=3)]
    event = EventRow(ts=1000.0, kind="non-finite", message="skipped a batch", data={"batch": 699}, count=700, last_ts=1084.0)
    return [
        training_status(),
        Status(protocol=1, version="0.1.0", state="idle", started_at=900.0),
        JoinResult(protocol=1, version="0.1.0", state="joining", started_at=900.0, warnings=["outer lr too high"]),
        PeersResult(run_id="tiny-demo", peers=peers, bans=bans),
        PeersUpdate(run_id="tiny-demo", peers=peers),
        UnbanResult(run_id="tiny-demo", unbanned=["QmRogue"], bans=[]),
        EventsResult(events=[event, EventRow(ts=1001.0, kind="paused", message="paused (user)", data=None)]),
    ]


def records_in(value: object) -> set[type]:
    if isinstance(value, Record):
        return {type(value)} | set().union(*(records_in(getattr(value, name)) for name in value.SCHEMA))
    if isinstance(value, list):
        return set().union(set(), *(records_in(item) for item in value))
    if isinstance(value, dict):
        return set().union(set(), *(records_in(item) for item in value.values()))
    return set()


@pytest.mark.parametrize("reply", every_reply(), ids=lambda reply: type(reply).__name__)
def test_every_reply_reads_back_as_the_record_the_daemon_sent(reply):
    wire = json.loads(json.dumps(reply.to_dict()))
    assert type(reply).from_dict(wire) == reply
    assert type(reply).from_dict(wire).to_dict() == wire


def test_the_round_trips_cover_every_record_of_the_protocol():
    covered = set().union(*(records_in(reply) for reply in every_reply()))
    every = {value for value in vars(control_types).values() if isinstance(value, type) and issubclass(value, Record)}
    assert every - {Record} - covered == set(), "add the new record to every_reply()"


def test_every_field_is_on_the_wire_null_when_unknown():
    wire = Status(protocol=1, version="0.1.0", state="idle", started_at=900.0).to_dict()
    assert list(wire) == list(Status.SCHEMA)
    assert (wire["run"], wire["local"], wire["pause_reason"], wire["health"]) == (None, None, None, [])


@pytest.mark.parametrize("break_it, complaint", [
    (lambda wire: wire["local"]["workers"][0].update(loss="low"),
     "the status reply: local: workers[0]: loss must be a number or null, not 'low'"),
    (lambda wire: wire["run"].pop("epoch"), "the status reply: run has no epoch"),
    (lambda wire: wire.update(state=None), "the status reply: state must be a string, not None"),
    (lambda wire: wire["local"]["workers"][0].update(trained_samples=True),
     "the status reply: local: workers[0]: trained_samples must be an integer, not True"),
    (lambda wire: wire["local"]["unused_samples"].update(late="3"),
     "the status reply: local: unused_samples.late must be an integer, not '3'"),
    (lambda wire: wire["hardware"].update(gpus={}), "the status reply: hardware: gpus must be a list of a Gpu object, not {}"),
    (lambda wire: wire["health"].append("all well"), "the status reply: health[1] must be an object, not 'all well'"),
], ids=["wrong type deep down", "missing field", "null where required", "bool for an int", "a count by reason",
        "object for a list", "string for an object"])
def test_a_malformed_status_is_one_line_naming_the_field(break_it, complaint):
    wire = training_status().to_dict()
    break_it(wire)
    with pytest.raises(MalformedReply) as error:
        Status.from_dict(wire, "the status reply")
    assert str(error.value) == complaint
    assert isinstance(error.value, ValueError)


def test_a_reply_that_is_no_object_is_refused():
    with pytest.raises(MalformedReply, match="^PeersResult must be an object, not \\[\\]$"):
        PeersResult.from_dict([])


def test_a_newer_daemons_field_is_ignored_and_an_older_ones_missing_optional_field_is_none():
    wire = training_status().to_dict()
    wire["run"]["added_later"] = 1
    del wire["local"]["waiting"], wire["local"]["workers"][0]["plan"]
    status = Status.from_dict(wire)
    assert status.local.waiting is None and status.local.workers[0].plan is None
    assert not hasattr(status.run, "added_later")


def test_a_record_is_built_by_name_and_refuses_unknown_or_missing_fields():
    with pytest.raises(TypeError, match="Health needs level"):
        Health(message="m")
    with pytest.raises(TypeError, match="Health has no field colour"):
        Health(level="error", message="m", colour="red")
    assert Health(level="error", message="m").fix == ""
    assert PeerRow(peer_id="QmA").replace(banned=True) == PeerRow(peer_id="QmA", banned=True)


def test_pushes_are_read_as_their_records():
    status = training_status()
    assert decode_push(Push.SNAPSHOT, status.to_dict()) == status
    assert decode_push(Push.PEERS, {"run_id": "r", "peers": [{"peer_id": "QmA"}]}) == PeersUpdate(run_id="r", peers=[PeerRow(peer_id="QmA")])
    step = {"type": "step", "ts": 1.0, "loss": 2.5, "worker": "gpu0"}
    assert decode_push(Push.STEP, step) is step  # a row of the steps table, as a dict
    assert decode_push("added-later", [1]) == [1]  # a newer daemon's push is left to the client to ignore
    with pytest.raises(MalformedReply, match="^the event push: ts must be a number, not None$"):
        decode_push(Push.EVENT, {"ts": None, "kind": "k", "message": "m"})


def test_repeated_events_say_how_many_in_how_long():
    assert EventRow(ts=1000.0, kind="k", message="m", count=700, last_ts=1084.0).repeated_words() == " (x700 in 84 s)"
    assert EventRow(ts=1000.0, kind="k", message="m", count=None).repeated_words() == ""


def test_the_daemons_plan_is_the_plan_status_shows():
    from p2ptrain.daemon.plan import Plan as DaemonPlan

    made = DaemonPlan(model="tiny", device="cpu", device_name="Xeon", precision="fp32", quantization="none", micro_batch=4,
                      grad_accum=2, cpu_threads=4, seq_len=128, memory_estimate_gib=0.5, memory_allowed_gib=8.0)
    shown = made.to_status()
    assert shown.to_dict() == made.to_dict() and shown.samples_per_step == 8
    assert Plan.from_dict(json.loads(json.dumps(shown.to_dict()))) == shown


def test_the_pipe_checks_a_peer_row_of_a_swarm_report_with_the_same_record():
    swarm = {"type": "swarm", "epoch": 3, "samples_accumulated": 0, "target_batch_size": 512, "eta_next_epoch_s": None,
             "num_peers": 1, "peers": [{"peer_id": "QmA", "loss": 2.0}]}
    assert decode_report(swarm).peers == [PeerRow(peer_id="QmA", loss=2.0)]
    assert decode_report(swarm).to_dict()["peers"] == [PeerRow(peer_id="QmA", loss=2.0).to_dict()]
    with pytest.raises(MalformedMessage, match="loss must be a number or null, not 'low'"):
        decode_report({**swarm, "peers": [{"peer_id": "QmA", "loss": "low"}]})


def test_p2ptrain_status_says_in_one_line_when_the_daemons_reply_is_malformed(monkeypatch, capsys):
    wire = training_status().to_dict()
    wire["local"]["trained_samples"] = "many"
    monkeypatch.setattr(ControlClient, "call", lambda self, method, **params: wire)

    assert cli.main(["status"]) == cli.EXIT_ERROR

    printed = capsys.readouterr()
    assert printed.out == ""
    assert printed.err.count("\n") == 1
    assert "the daemon's status reply: local: trained_samples must be an integer, not 'many'" in printed.err
    assert "restart the daemon" in printed.err


def test_p2ptrain_status_prints_the_reply_of_a_newer_daemon_as_it_came(monkeypatch, capsys):
    wire = training_status().to_dict()
    wire["added_later"] = {"x": 1}
    monkeypatch.setattr(ControlClient, "call", lambda self, method, **params: wire)

    assert cli.main(["status", "--json"]) == cli.EXIT_OK
    assert json.loads(capsys.readouterr().out) == wire


def test_the_cli_imports_no_dataclasses_typing_or_heavy_module():
    # `import dataclasses` brings `inspect` (about 12 ms of every `p2ptrain status`); the status goal is 2x `python -c pass`
    imported = subprocess.run([sys.executable, "-X", "importtime", "-c", "import p2ptrain.cli"],
                              capture_output=True, text=True, check=True).stderr
    modules = {line.rsplit("|", 1)[-1].strip() for line in imported.splitlines() if line.startswith("import time:")}
    assert "p2ptrain.control_types" in modules, "the CLI reads the daemon's replies through control_types"
    slow = {"dataclasses", "typing", "inspect", "hashlib", "torch", "hivemind", "pydantic", "textual"}
    assert modules & slow == set()
