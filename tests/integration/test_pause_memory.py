"""``pause`` gives the training memory back: a real daemon fully training a ~26 M-parameter local Llama.

A pause ends the training worker once it has checkpointed (model, gradients,
optimizer state, the CUDA context: all of it goes with the process), ``resume``
starts a new one from that checkpoint, and a daemon restarted while paused
stays paused without starting a worker. The memory is the USS of the daemon's
whole process tree (what the volunteer gets back), measured with psutil.
"""

from __future__ import annotations

import json
import time

import psutil
import pytest
from local_models import save_small_corpus, save_small_llama

from daemons import cli, start_daemon, write_local_config

pytestmark = [pytest.mark.swarm]

# AdamW trains every weight: fp32 weights, gradients and two moments
BYTES_PER_TRAINED_PARAMETER = 16


def process_tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_uss_mib(pid: int) -> float:
    """Unique memory of the daemon and everything under it, in MiB."""
    total = 0
    for process in process_tree(pid):
        try:
            total += process.memory_full_info().uss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total / 2**20


def workers_of(pid: int) -> list[str]:
    """The daemon's training processes (its worker, DHT, averagers, p2pd), not multiprocessing's resource tracker."""
    found = []
    for process in process_tree(pid)[1:]:
        try:
            command = " ".join(process.cmdline())
        except psutil.NoSuchProcess:
            continue
        if "resource_tracker" not in command:
            found.append(f"{process.pid} {command[:100]}")
    return found


def status_json(home) -> dict:
    return json.loads(cli(home, "status", "--json").stdout)


def worker_state(status: dict) -> str | None:
    workers = (status.get("local") or {}).get("workers") or [{}]
    return workers[0].get("state")


@pytest.mark.timeout(600)
def test_pause_gives_back_the_training_memory_and_resume_goes_on_from_the_checkpoint(tmp_path, short_tmp):
    model_dir = tmp_path / "llama-26m"
    save_small_llama(model_dir, hidden_size=512, intermediate_size=1376, layers=8, heads=8)
    corpus = tmp_path / "corpus.txt"
    save_small_corpus(corpus)
    home = short_tmp / "pm"
    write_local_config(home)
    daemon = start_daemon(home)
    try:
        created = cli(home, "join", "--new-run", "pause-memory", "--mode", "sync", "--model", str(model_dir),
                      "--micro-batch", "4", "--seq-len", "64", "--target-batch-size", "16", "--dataset", str(corpus))
        assert created.returncode == 0, created.stderr
        # epoch 1 ends with the first optimizer step: AdamW's moments exist from then on
        training = daemon.wait_until(lambda s: s["state"] == "training" and s["run"]["epoch"] >= 1
                                     and ((s.get("local") or {}).get("samples_per_second") or 0) > 0, 300,
                                     what="training past epoch 1")
        parameters = training["local"]["parameters"]
        assert training["local"]["trainable_parameters"] == parameters > 25_000_000, "full training of a ~26 M model"
        assert training["local"]["calibrated_samples_per_second"] > 0
        training_mib = max(tree_uss_mib(daemon.process.pid) for _ in range(3))

        assert cli(home, "pause").returncode == 0
        paused = daemon.wait_until(lambda s: worker_state(s) == "paused" and not workers_of(daemon.process.pid), 120,
                                   what="the worker to checkpoint and end")
        paused_mib = tree_uss_mib(daemon.process.pid)
        given_back_mib = training_mib - paused_mib
        owed_mib = 0.8 * BYTES_PER_TRAINED_PARAMETER * parameters / 2**20
        print(f"\n{parameters / 1e6:.1f} M parameters: daemon tree USS {training_mib:.0f} MiB training, {paused_mib:.0f} MiB "
              f"paused: {given_back_mib:.0f} MiB given back (at least {owed_mib:.0f} MiB owed)")
        assert given_back_mib >= owed_mib
        assert (paused["state"], paused["pause_reason"]) == ("paused", "user")
        # the run as last seen, marked as such
        assert paused["run"]["as_of"] is not None and paused["run"]["eta_next_epoch_s"] is None
        assert paused["local"]["samples_per_second"] is None
        contributed, epoch = paused["local"]["contributed_samples"], paused["run"]["epoch"]
        assert contributed >= 16 and epoch >= 1

        # a daemon restarted while paused stays paused and starts no worker
        assert daemon.terminate(timeout=60) == 0
        daemon = start_daemon(home)
        time.sleep(5)
        restarted = status_json(home)
        assert (restarted["state"], restarted["pause_reason"]) == ("paused", "user")
        assert workers_of(daemon.process.pid) == []
        assert restarted["local"]["contributed_samples"] == contributed and restarted["run"]["epoch"] == epoch
        assert restarted["run"]["as_of"] is not None

        resumed_at = time.monotonic()
        assert cli(home, "resume").returncode == 0
        shown, rejoined_after = [], []

        def next_epoch(status: dict) -> bool:
            if status.get("local") and worker_state(status) == "training":
                shown.append(status["local"]["contributed_samples"])
                rejoined_after.append(time.monotonic() - resumed_at)
            return status["state"] == "training" and status["run"]["epoch"] >= epoch + 1
        daemon.wait_until(next_epoch, 300, what="the next epoch after resume")
        print(f"resume: training again after {rejoined_after[0]:.0f} s, the next epoch after {time.monotonic() - resumed_at:.0f} s")
        assert shown and min(shown) >= contributed, f"contributed samples went back after resume: {shown[:5]} < {contributed}"
        events = json.loads(cli(home, "events", "--json", "--limit", "500").stdout)["events"]
        loaded = [event for event in events if event["kind"] == "checkpoint-loaded"]
        assert loaded and loaded[-1]["data"]["epoch"] == epoch, "resume starts from the pause checkpoint"
        assert [event for event in events if event["kind"] == "checkpoint-saved" and event["data"]["reason"] == "pause"]
    finally:
        daemon.terminate(timeout=60)
        daemon.kill()


@pytest.mark.timeout(600)
def test_pause_gives_the_gpu_back(tmp_path, daemons):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU here: the CPU test above checks that a pause ends the worker")
    import pynvml

    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(index) for index in range(pynvml.nvmlDeviceGetCount())]

    def pids_on_gpus() -> set[int]:
        return {process.pid for handle in handles for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}

    daemon = daemons.start("gpu")
    assert cli(daemon.home, "join", "--new-run", "pause-gpu", "--mode", "sync", "--target-batch-size", "64").returncode == 0
    daemon.wait_until(lambda s: s["state"] == "training" and ((s.get("local") or {}).get("samples_per_second") or 0) > 0, 300,
                      what="training on the GPU")
    tree = {process.pid for process in process_tree(daemon.process.pid)}
    assert tree & pids_on_gpus(), "the worker trains on the GPU"
    assert cli(daemon.home, "pause").returncode == 0
    daemon.wait_until(lambda s: worker_state(s) == "paused", 120, what="the worker to end")
    assert not {process.pid for process in process_tree(daemon.process.pid)} & pids_on_gpus()
