"""The hardware probe, with NVML faked only at the pynvml boundary (this machine has no NVIDIA GPU)."""

from __future__ import annotations

import os

import pynvml
import pytest

from fake_nvml import FakeNvml, card
from p2ptrain.control_types import Hardware
from p2ptrain.daemon.hardware_probe import probe, select_gpus


def test_probe_reports_each_gpu_in_the_status_shape():
    nvml = FakeNvml([card(compute=[(os.getpid(), 900)], graphics=[1]),
                     card("Tesla T4", 15360, 0, (7, 5), fan=None)])
    facts = probe(nvml=nvml)
    status = facts.to_status()
    first, second = status.gpus
    assert (first.memory_total_mib, first.memory_used_mib, first.memory_free_mib) == (24564, 1200, 23364)
    assert (first.power_w, first.power_limit_w, first.compute_capability) == (123.456, 450.0, "8.9")
    assert second.fan_pct is None and second.name == "Tesla T4"
    ours = next(process for process in first.processes if process.pid == os.getpid())
    assert ours.used_memory_mib == 900 and ours.kinds == ["compute"]
    assert status.cpu.cores_logical >= 1 and status.ram.total_mib > 0
    assert Hardware.from_dict(status.to_dict()) == status, "what the daemon sends, a client reads back"
    assert facts.health == [] and nvml.shutdowns == 1


def test_devices_use_free_memory_and_end_with_the_cpu():
    devices = probe(nvml=FakeNvml([card(used=20000)])).devices()
    assert [device.kind for device in devices] == ["cuda", "cpu"]
    assert devices[0].memory_free_mib == 4564 and devices[0].compute_capability == (8, 9)


def test_probe_without_an_nvidia_driver_falls_back_to_the_cpu():
    facts = probe()  # the real pynvml: this machine has no NVIDIA library
    assert facts.gpus == []
    assert [device.kind for device in facts.devices()] == ["cpu"]
    assert facts.health[0]["level"] == "info" and "CPU" in facts.health[0]["message"]


def test_probe_retries_while_the_driver_loads_after_boot():
    waits = []
    nvml = FakeNvml([card()], init_errors=[pynvml.NVML_ERROR_DRIVER_NOT_LOADED] * 2)
    facts = probe(nvml=nvml, retries=3, retry_delay_s=5, sleep=waits.append)
    assert len(facts.gpus) == 1 and waits == [5, 5] and nvml.init_calls == 3


def test_probe_gives_up_after_its_retries_with_a_fix():
    nvml = FakeNvml([card()], init_errors=[pynvml.NVML_ERROR_DRIVER_NOT_LOADED] * 5)
    facts = probe(nvml=nvml, retries=1, sleep=lambda seconds: None)
    assert facts.gpus == [] and facts.health[0]["level"] == "error" and "nvidia-smi" in facts.health[0]["fix"]


def test_a_service_user_outside_the_video_group_gets_the_fix():
    facts = probe(nvml=FakeNvml([card()], init_errors=[pynvml.NVML_ERROR_NO_PERMISSION]))
    assert facts.gpus == []
    assert "permission" in facts.health[0]["message"]
    assert "usermod -aG video,render" in facts.health[0]["fix"]


def test_one_worker_per_selected_gpu():
    facts = probe(nvml=FakeNvml([card(), card("NVIDIA A100-SXM4-80GB", 81920, 0, (8, 0))]))
    assert [device.index for device in select_gpus("all", facts)] == [0, 1]
    assert [device.name for device in select_gpus([1], facts)] == ["NVIDIA A100-SXM4-80GB"]
    with pytest.raises(ValueError, match="has GPUs \\[0, 1\\]"):
        select_gpus([3], facts)
    assert [device.kind for device in select_gpus("all", probe())] == ["cpu"]
