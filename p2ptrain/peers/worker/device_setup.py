"""The worker's side of the hardware plan: getting one, checking the device can run it, holding to its cap.

A worker the daemon started without a plan (a peer joining a run: the daemon
had no manifest to plan from) reads the manifest from the swarm, makes sure the
model's ``config.json`` is on this machine (the daemon sizes the plan from it),
reports ``PlanWanted`` and waits for the daemon's ``UsePlan``
(``wait_for_plan``). Commands that arrive meanwhile are kept for the training
loop. ``check_device`` fails in one line when the plan names a GPU that this
machine's torch cannot use, and ``cap_gpu_memory`` holds torch's allocator to
the plan's share, so going past it raises an out-of-memory error that takes
the back-off path (``calibration``, the daemon's restarts). torch is imported
inside the functions.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from p2ptrain.peers.worker.run_setup import WorkerFailure
from p2ptrain.worker_pipe import Command, MalformedMessage, PlanWanted, Report, UsePlan, WorkerPlan, decode_command

logger = logging.getLogger(__name__)

PLAN_TIMEOUT_S = 60.0
NO_PLAN_FIX = "see the daemon log; restart the daemon (systemctl restart p2ptrain) if it is stuck"


def wait_for_plan(conn, report: Callable[[Report], None], manifest: dict, kept: list[Command],
                  timeout_s: float = PLAN_TIMEOUT_S) -> WorkerPlan:
    """Ask the daemon for a plan for ``manifest`` and wait for its answer.

    Args:
        conn: the worker's end of the pipe.
        report: sends a report up the pipe.
        manifest: the run's manifest as JSON.
        kept: other commands received meanwhile are appended here, for the training loop.
        timeout_s: how long the daemon may take.

    Raises:
        WorkerFailure: the daemon found no plan (its reason and fix), or did not answer.
    """
    fetch_model_config(manifest.get("model") or "")
    report(PlanWanted(manifest=manifest))
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        if not conn.poll(min(left, 1.0)):
            continue
        received = conn.recv()
        try:
            command = decode_command(received)
        except MalformedMessage as error:
            logger.warning("Ignoring a command while waiting for the plan: %s", error)
            continue
        if not isinstance(command, UsePlan):
            kept.append(command)
        elif command.plan is None:
            raise WorkerFailure(f"no hardware plan: {command.failure}", command.fix or NO_PLAN_FIX)
        else:
            return command.plan
    raise WorkerFailure(f"the daemon sent no hardware plan within {timeout_s:.0f} s", NO_PLAN_FIX)


def fetch_model_config(model: str) -> None:
    """Put a hub model's ``config.json`` in the local Hugging Face cache, where the daemon's planner reads it.

    The tiny preset and local directories need nothing; a hub that cannot be reached
    is left for the daemon to say so (its plan fails with the fix).
    """
    if model.count("/") != 1 or model.startswith((".", "/", "~")) or Path(model).expanduser().is_dir():
        return
    try:
        from huggingface_hub import hf_hub_download

        hf_hub_download(model, "config.json")
    except Exception as error:  # offline, unknown repo, gated: the planner reports it
        logger.info("Could not fetch the config of %s: %s", model, error)


def check_device(plan: WorkerPlan) -> None:
    """Fail in one line when ``plan`` names a CUDA device that this machine's torch cannot use.

    Raises:
        WorkerFailure: torch was built without CUDA, or sees no GPU.
    """
    import torch

    if not plan.device.startswith("cuda") or torch.cuda.is_available():
        return
    built = "torch here is a CPU-only build" if torch.version.cuda is None else "torch sees no CUDA GPU (driver?)"
    raise WorkerFailure(
        f"the plan trains on the GPU {plan.device_name or plan.device}, but {built}",
        "install torch with CUDA (pip install torch), or train on the CPU: p2ptrain config set training.device cpu",
    )


def cap_gpu_memory(plan: WorkerPlan, cuda=None) -> float | None:
    """Hold torch's allocator on the plan's GPU to ``plan.memory_cap_bytes``; returns the fraction set.

    Args:
        plan: the worker's plan (nothing is capped on the CPU or without a cap).
        cuda: ``torch.cuda`` (a test passes a stand-in for a GPU this machine lacks).
    """
    if not plan.device.startswith("cuda") or not plan.memory_cap_bytes:
        return None
    if cuda is None:
        import torch

        cuda = torch.cuda
    device = int(plan.device.partition(":")[2] or 0)
    total = cuda.get_device_properties(device).total_memory
    fraction = min(1.0, plan.memory_cap_bytes / total)
    cuda.set_per_process_memory_fraction(fraction, device)
    logger.info("GPU memory capped at %.0f MiB (%.1f%% of %.0f MiB)", plan.memory_cap_bytes / 2**20, 100 * fraction, total / 2**20)
    return fraction
