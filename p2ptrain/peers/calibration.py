"""Confirming the plan before the first step: real forward/backward passes at the planned micro-batch.

The daemon's plan is memory arithmetic; a real step settles it. The worker
calls ``calibrate`` once the model is built and before it joins the averaging,
so a micro-batch that does not fit costs no averaging round: one
forward/backward pass warms up (allocator, kernels), a few more are timed. On
an out-of-memory error the micro-batch is halved (``halved_micro_batch``, the
back-off the daemon also uses when a worker runs out of memory later, while
training) and tried again; at micro-batch 1 the worker gives up with
``out_of_memory_failure``. The gradients are dropped afterwards: the model is
as it was.

The measured samples per second go to ``cache_dir/plans.json``, keyed by
(model, device, precision, quantization), where ``p2ptrain plan`` shows them
next to its arithmetic. torch is imported inside the functions: ``p2ptrain
plan`` reads the cache without it.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from p2ptrain.peers.out_of_memory import is_out_of_memory
from p2ptrain.peers.run_setup import WorkerFailure
from p2ptrain.worker_pipe import halved_micro_batch

logger = logging.getLogger(__name__)

CACHE_FILE = "plans.json"
TIMED_PASSES = 2


@dataclass(frozen=True)
class Calibration:
    """What the real passes showed.

    Attributes:
        micro_batch, grad_accum: what fits (the plan's, or halved from it).
        samples_per_second: forward/backward speed at ``micro_batch``.
        out_of_memory_at: the micro-batches that did not fit, largest first.
    """

    micro_batch: int
    grad_accum: int
    samples_per_second: float
    out_of_memory_at: tuple[int, ...] = ()


def out_of_memory_failure(model: str, device: str, error: BaseException, micro_batch: int | None = 1) -> WorkerFailure:
    """The fatal error of a worker out of memory with nothing smaller to try (at start-up or while training).

    Args:
        model: the model's name.
        device: where it ran out (``cpu``, ``cuda:0``).
        error: the allocation failure.
        micro_batch: 1, or None when the model itself did not fit while it was loaded.
    """
    first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
    when = "even at micro-batch 1" if micro_batch else "while loading it"
    return WorkerFailure(
        f"{model} runs out of memory on {device} {when} ({first_line[:200]})",
        "free memory on that device, or train a smaller model or a shorter seq_len",
    )


def calibrate(model, name: str, device: str, micro_batch: int, grad_accum: int, seq_len: int,
              timed_passes: int = TIMED_PASSES) -> Calibration:
    """Run real forward/backward passes at ``micro_batch``, halving it until they fit.

    Args:
        model: the worker's model (its weights are left as they were; its gradients are dropped).
        name: the model's name, for the error message.
        device: where the model is (``cpu``, ``cuda:0``).
        micro_batch, grad_accum: the plan's.
        seq_len: tokens per sample (the manifest's).
        timed_passes: passes timed after the warm-up one.

    Raises:
        WorkerFailure: out of memory even at micro-batch 1.
    """
    failed: list[int] = []
    while True:
        try:
            samples_per_second = _measure(model, device, micro_batch, seq_len, timed_passes)
            break
        except Exception as error:
            if not (isinstance(error, MemoryError) or is_out_of_memory(error)):
                raise
            failure = error
        # outside the except block, so the failed pass's tensors (held by the traceback) can be freed
        _release(model, device)
        smaller = halved_micro_batch(micro_batch, grad_accum)
        if smaller is None:
            raise out_of_memory_failure(name, device, failure)
        logger.warning("Out of memory at micro-batch %d: trying %d x %d", micro_batch, *smaller)
        failed.append(micro_batch)
        micro_batch, grad_accum = smaller
    return Calibration(micro_batch, grad_accum, samples_per_second, tuple(failed))


def _measure(model, device: str, micro_batch: int, seq_len: int, timed_passes: int) -> float:
    import torch

    from p2ptrain.peers.models import causal_lm_loss

    vocab = model.get_input_embeddings().num_embeddings
    generator = torch.Generator().manual_seed(0)
    batch = torch.randint(0, vocab, (micro_batch, seq_len), generator=generator)
    try:
        causal_lm_loss(model, batch).backward()
        _synchronize(device)
        started = time.perf_counter()
        for _ in range(timed_passes):
            causal_lm_loss(model, batch).backward()
        _synchronize(device)
        return micro_batch * timed_passes / (time.perf_counter() - started)
    finally:
        _release(model, device)


def _synchronize(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def _release(model, device: str) -> None:
    """Drop the passes' gradients and give their memory back (to the CUDA driver too)."""
    model.zero_grad(set_to_none=True)
    gc.collect()
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


# ----- the plan cache ------------------------------------------------------------------


def cache_key(model: str, device_name: str, precision: str, quantization: str) -> str:
    """One measurement per model, device, precision and quantization."""
    return "|".join((model, device_name, precision, quantization))


def read_plan_cache(cache_dir: str | os.PathLike) -> dict:
    """Every cached measurement by ``cache_key`` ({} when there is none or the file is damaged)."""
    try:
        data = json.loads((Path(cache_dir) / CACHE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def record_calibration(cache_dir: str | os.PathLike, key: str, calibration: Calibration, seq_len: int) -> None:
    """Store ``calibration`` under ``key`` in ``cache_dir/plans.json`` (atomically: a reader never sees half a file).

    Several workers of one daemon share the file: each rewrites it with its own key changed.
    """
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    cache = read_plan_cache(cache_dir)
    cache[key] = {
        "samples_per_second": calibration.samples_per_second, "micro_batch": calibration.micro_batch,
        "grad_accum": calibration.grad_accum, "seq_len": seq_len, "out_of_memory_at": list(calibration.out_of_memory_at),
        "measured_at": time.time(),
    }
    temporary = cache_dir / f".{CACHE_FILE}.{os.getpid()}.tmp"
    temporary.write_text(json.dumps(cache, indent=2, sort_keys=True))
    temporary.replace(cache_dir / CACHE_FILE)
