"""The worker's side of the hardware plan: waiting for the daemon's plan on a real pipe, refusing a GPU plan
that this machine's torch cannot run, and holding the GPU allocator to the plan's cap (``torch.cuda`` stood
in for at its boundary: this machine has no GPU)."""

from __future__ import annotations

import multiprocessing
import threading

import pytest

from p2ptrain.config import Config
from p2ptrain.daemon.plan import DeviceFacts, PlanPolicy
from p2ptrain.daemon.worker_slots import hardware_plan, worker_plan, worker_slots
from p2ptrain.paths import resolve_paths
from p2ptrain.peers.worker.device_setup import cap_gpu_memory, check_device, wait_for_plan
from p2ptrain.peers.worker.run_setup import WorkerFailure
from p2ptrain.worker_pipe import Pause, PlanWanted, Unban, UsePlan, WorkerPlan, decode_report, encode

GIB = 1024**3
MANIFEST = {"run_id": "r", "model": "tiny", "seq_len": 128, "micro_batch_hint": 8}


class RecordingCuda:
    """What ``torch.cuda`` offers the cap, for an 80 GiB card; records the fraction it was given."""

    def __init__(self, total: int = 80 * GIB):
        self.total, self.fractions = total, []

    def get_device_properties(self, device):
        return type("Properties", (), {"total_memory": self.total})()

    def set_per_process_memory_fraction(self, fraction, device):
        self.fractions.append((fraction, device))


def test_the_allocator_cap_comes_from_the_volunteers_memory_share(tmp_path):
    h100 = DeviceFacts(kind="cuda", name="NVIDIA H100 80GB HBM3", memory_total_mib=81920, memory_free_mib=81920,
                       compute_capability=(9, 0), index=0, cpu_cores=16)
    [slot] = worker_slots([h100], resolve_paths(tmp_path))
    policy = PlanPolicy.from_settings(Config(policy={"max_vram_share": 0.04}).policy)
    plan = worker_plan(slot, hardware_plan(slot, MANIFEST, policy))
    # 4 % of 80 GiB free is 3.2 GiB; the CUDA context (0.5 GiB) lives outside the allocator
    assert plan.memory_cap_bytes == pytest.approx(2.7 * GIB, rel=0.01)
    cuda = RecordingCuda()
    assert cap_gpu_memory(plan, cuda) == pytest.approx(2.7 / 80, rel=0.01)
    assert cuda.fractions == [(pytest.approx(2.7 / 80, rel=0.01), 0)]
    assert cap_gpu_memory(WorkerPlan(device="cpu", memory_cap_bytes=GIB), cuda) is None and len(cuda.fractions) == 1


def test_a_gpu_plan_on_a_torch_without_cuda_fails_in_one_line_with_the_fix():
    with pytest.raises(WorkerFailure) as failure:
        check_device(WorkerPlan(device="cuda:0", device_name="Tesla T4"))
    assert "the plan trains on the GPU Tesla T4, but torch here" in failure.value.message
    assert "\n" not in failure.value.message and "pip install torch" in failure.value.fix
    check_device(WorkerPlan(device="cpu"))


def answer_after(daemon_end, *commands) -> threading.Thread:
    """The daemon's side: read the worker's PlanWanted, then send ``commands``."""

    def answer():
        wanted = decode_report(daemon_end.recv())
        assert isinstance(wanted, PlanWanted) and wanted.manifest["model"] == "tiny"
        for command in commands:
            daemon_end.send(encode(command))

    thread = threading.Thread(target=answer)
    thread.start()
    return thread


def test_a_joining_worker_waits_for_its_plan_and_keeps_the_commands_that_came_first():
    daemon_end, worker_end = multiprocessing.Pipe()
    planned = WorkerPlan(device="cpu", micro_batch=4, grad_accum=2, cpu_threads=1)
    daemon = answer_after(daemon_end, Unban(peers=["QmRogue"]), Pause(), UsePlan(planned))
    kept = []
    assert wait_for_plan(worker_end, lambda report: worker_end.send(encode(report)), MANIFEST, kept, timeout_s=20) == planned
    daemon.join()
    assert kept == [Unban(peers=["QmRogue"]), Pause()]


def test_no_plan_from_the_daemon_is_a_failure_with_its_reason_and_fix():
    daemon_end, worker_end = multiprocessing.Pipe()
    daemon = answer_after(daemon_end, UsePlan(failure="tiny does not fit on a 1 GiB GPU", fix="use a device with more memory"))
    with pytest.raises(WorkerFailure) as failure:
        wait_for_plan(worker_end, lambda report: worker_end.send(encode(report)), MANIFEST, [], timeout_s=20)
    daemon.join()
    assert (failure.value.message, failure.value.fix) == ("no hardware plan: tiny does not fit on a 1 GiB GPU", "use a device with more memory")
    _, worker_end = multiprocessing.Pipe()
    with pytest.raises(WorkerFailure, match="sent no hardware plan within 1 s"):
        wait_for_plan(worker_end, lambda report: None, MANIFEST, [], timeout_s=1)
