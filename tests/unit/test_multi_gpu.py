"""One training worker (one peer) per GPU: from (training.gpus, probed devices) to
worker specs. NVML is faked at its boundary (this machine has no NVIDIA GPU);
everything after the probe is the real code."""

from __future__ import annotations

import os
import signal
import subprocess
import threading

import pytest
from test_hardware import FakeNvml, card

from p2ptrain.config import Config
from p2ptrain.daemon.hardware_probe import probe
from p2ptrain.daemon.model_facts import ModelFactsError
from p2ptrain.daemon.plan import PlanPolicy
from p2ptrain.daemon.worker_process import reap_leftover_groups
from p2ptrain.daemon.worker_slots import (
    hardware_plan,
    leftover_pgid_files,
    restart_delay_s,
    select_devices,
    shifted_ports,
    worker_plan,
    worker_slots,
    worker_spec,
)
from p2ptrain.paths import resolve_paths

LORA_MANIFEST = {
    "run_id": "r",
    "model": "gemma-2b",
    "lora": {"r": 8, "alpha": 16, "dropout": 0.05, "target_modules": ["q_proj", "v_proj"]},
    "seq_len": 512,
    "micro_batch_hint": 16,
}


def two_gpus():
    """A 24 GiB RTX 4090 (index 0) and a 15 GiB Tesla T4 (index 1)."""
    return probe(nvml=FakeNvml([card(), card("Tesla T4", 15360, 0, (7, 5), fan=None)]))


def config(**training) -> Config:
    return Config(nickname="box", training=training)


def specs(slots, paths, manifest=LORA_MANIFEST, cfg=None):
    cfg = cfg or config()
    plans = [worker_plan(slot, hardware_plan(slot, manifest, PlanPolicy())) for slot in slots]
    return [worker_spec(slot, {"run_id": "r", "manifest": manifest}, cfg, paths, plan, len(slots)) for slot, plan in zip(slots, plans)]


def test_two_gpus_get_two_workers_each_its_own_peer_files(tmp_path):
    paths = resolve_paths(tmp_path)
    slots = worker_slots(select_devices(config(gpus="all"), two_gpus()), paths)

    assert [slot.name for slot in slots] == ["gpu0", "gpu1"]
    first, second = slots
    # the first keeps the single-worker files: a machine that gains a GPU keeps its peer id and checkpoint
    assert (first.identity_key, first.checkpoints_dir, first.pgid_file) == (paths.identity_key, paths.checkpoints_dir, paths.worker_pgid_file)
    assert second.identity_key == paths.state_dir / "identity-gpu1.key"
    assert second.checkpoints_dir == paths.checkpoints_dir / "gpu1"
    assert second.pgid_file == paths.state_dir / "worker-gpu1.pgid"
    for attribute in ("identity_key", "checkpoints_dir", "pgid_file"):
        assert len({getattr(slot, attribute) for slot in slots}) == 2, attribute


def test_each_gpu_worker_sees_only_its_own_gpu_in_pci_bus_order(tmp_path):
    paths = resolve_paths(tmp_path)
    slots = worker_slots(select_devices(config(), two_gpus()), paths)
    first, second = specs(slots, paths)

    assert first.environment == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0"}
    assert second.environment == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1"}
    assert (first.device_label, second.device_label) == ("cuda:0", "cuda:1")  # what peers are shown
    # inside the worker its one visible card is cuda:0; the daemon shows this machine's numbering
    assert first.plan.device == second.plan.device == "cuda:0"
    assert [slot.device_label for slot in slots] == ["cuda:0", "cuda:1"]
    assert (first.paths.identity_key, second.paths.identity_key) == (str(paths.identity_key), str(paths.state_dir / "identity-gpu1.key"))
    assert second.paths.checkpoints_dir == str(paths.checkpoints_dir / "gpu1")
    assert first.paths.cache_dir == second.paths.cache_dir  # tokenized data is shared


def test_each_worker_gets_a_plan_sized_from_its_own_gpu(tmp_path):
    paths = resolve_paths(tmp_path)
    slots = worker_slots(select_devices(config(), two_gpus()), paths)
    assert [hardware_plan(slot, LORA_MANIFEST, PlanPolicy()).device_name for slot in slots] == ["NVIDIA GeForce RTX 4090", "Tesla T4"]
    rtx, t4 = (spec.plan for spec in specs(slots, paths))

    assert rtx.precision == "bf16" and t4.precision == "fp16"  # the T4 (7.5) has no bf16
    assert rtx.micro_batch > t4.micro_batch or t4.gradient_checkpointing or t4.quantization != "none"
    assert rtx.memory_cap_bytes > t4.memory_cap_bytes, "each allocator is capped at its own card's share"
    assert rtx.micro_batch * rtx.grad_accum == t4.micro_batch * t4.grad_accum == 16


def test_two_workers_listen_on_their_own_ports_and_say_their_gpu_in_the_nickname(tmp_path):
    paths = resolve_paths(tmp_path)
    cfg = config()
    cfg.dht.host_maddrs = ["/ip4/0.0.0.0/tcp/31337", "/ip4/127.0.0.1/tcp/0"]
    cfg.dht.announce_maddrs = ["/ip4/203.0.113.5/tcp/40000"]
    first, second = specs(worker_slots(select_devices(cfg, two_gpus()), paths), paths, cfg=cfg)

    assert first.dht.host_maddrs == ["/ip4/0.0.0.0/tcp/31337", "/ip4/127.0.0.1/tcp/0"]
    assert second.dht.host_maddrs == ["/ip4/0.0.0.0/tcp/31338", "/ip4/127.0.0.1/tcp/0"]
    assert second.dht.announce_maddrs == ["/ip4/203.0.113.5/tcp/40001"]
    assert (first.nickname, second.nickname) == ("box-gpu0", "box-gpu1")


def test_a_gpu_list_picks_those_gpus_in_its_order(tmp_path):
    paths = resolve_paths(tmp_path)
    slots = worker_slots(select_devices(config(gpus=[1]), two_gpus()), paths)
    assert [(slot.name, slot.identity_key) for slot in slots] == [("gpu1", paths.identity_key)]
    [spec] = specs(slots, paths)
    assert spec.environment["CUDA_VISIBLE_DEVICES"] == "1"
    assert spec.nickname == "box"  # one worker: the nickname as configured

    reversed_order = worker_slots(select_devices(config(gpus=[1, 0]), two_gpus()), paths)
    assert [slot.name for slot in reversed_order] == ["gpu1", "gpu0"]
    assert reversed_order[1].identity_key == paths.state_dir / "identity-gpu0.key"


def test_a_missing_gpu_in_training_gpus_is_one_line_with_the_fix(tmp_path):
    with pytest.raises(ValueError) as error:
        select_devices(config(gpus=[0, 3]), two_gpus())
    message = str(error.value)
    assert "\n" not in message and "[3]" in message and 'gpus = "all"' in message


def test_without_a_gpu_one_cpu_worker_runs_as_before(tmp_path):
    paths = resolve_paths(tmp_path)
    slots = worker_slots(select_devices(config(), probe(nvml=FakeNvml([]))), paths)
    assert [slot.name for slot in slots] == ["cpu"]
    [spec] = specs(slots, paths, manifest={**LORA_MANIFEST, "model": "tiny", "lora": None, "seq_len": 64})
    assert spec.environment == {}
    assert spec.plan.device == "cpu"
    assert spec.paths.to_dict() == {
        "state_dir": str(paths.state_dir),
        "cache_dir": str(paths.cache_dir),
        "checkpoints_dir": str(paths.checkpoints_dir),
        "identity_key": str(paths.identity_key),
    }
    assert spec.nickname == "box" and spec.dht.host_maddrs == config().dht.host_maddrs


def test_training_device_cpu_uses_the_cpu_even_with_gpus():
    devices = select_devices(config(device="cpu"), two_gpus())
    assert [device.kind for device in devices] == ["cpu"]


def test_a_gpu_worker_whose_model_is_unknown_gets_no_plan_and_a_fix(tmp_path):
    paths = resolve_paths(tmp_path)
    [slot] = worker_slots(select_devices(config(gpus=[1]), two_gpus()), paths)
    with pytest.raises(ModelFactsError, match="no-such-model-here"):
        hardware_plan(slot, {**LORA_MANIFEST, "model": "no-such-model-here"}, PlanPolicy())
    # joining an existing run: no manifest yet, so the spec has no plan and the worker asks for one
    spec = worker_spec(slot, {"run_id": "r", "manifest": None}, config(), paths, None, 1)
    assert spec.plan is None


def test_restart_back_off_grows_then_stays_at_its_longest():
    assert [restart_delay_s(crashes) for crashes in (1, 2, 3, 6, 50)] == [5, 10, 30, 300, 300]


def test_shifted_ports_leave_any_port_and_non_port_parts_alone():
    maddrs = ["/ip4/0.0.0.0/tcp/31337", "/ip6/::/tcp/0", "/ip4/0.0.0.0/udp/31337/quic"]
    assert shifted_ports(maddrs, 2) == ["/ip4/0.0.0.0/tcp/31339", "/ip6/::/tcp/0", "/ip4/0.0.0.0/udp/31339/quic"]
    assert shifted_ports(maddrs, 0) == maddrs


@pytest.mark.timeout(60)
def test_a_restarted_daemon_ends_the_groups_of_every_worker_it_left_behind(tmp_path):
    paths = resolve_paths(tmp_path)
    paths.create()
    slots = worker_slots(select_devices(config(), two_gpus()), paths)
    # stand-ins for two SIGKILLed daemon's worker groups: real process groups
    leaders = [subprocess.Popen(["sleep", "600"], start_new_session=True) for _ in slots]
    # a left-behind group has no parent waiting on it: reap ours at once, as init would
    reapers = [threading.Thread(target=leader.wait, daemon=True) for leader in leaders]
    for reaper in reapers:
        reaper.start()
    try:
        for slot, leader in zip(slots, leaders):
            slot.pgid_file.write_text(f"{leader.pid}\n")
        assert leftover_pgid_files(paths.state_dir) == sorted(slot.pgid_file for slot in slots)

        ended = reap_leftover_groups(paths.state_dir)

        assert sorted(ended) == sorted(leader.pid for leader in leaders)
        assert [leader.wait(timeout=10) for leader in leaders] == [-signal.SIGTERM] * 2
        assert leftover_pgid_files(paths.state_dir) == []
    finally:
        for leader in leaders:
            if leader.poll() is None:
                os.killpg(leader.pid, signal.SIGKILL)
                leader.wait()
