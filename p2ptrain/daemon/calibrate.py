"""Calibration: confirm a plan with real forward/backward steps, backing off on out-of-memory.

The plan's memory arithmetic is an estimate; a real step settles it. On an
out-of-memory error the micro-batch is halved (accumulation grows so a step
still has the manifest's samples), and below one sample the quantization gets
stronger (none -> int8 -> nf4, GPU and LoRA only). The measured samples per
second are cached in ``cache_dir/plans.json`` per (model, device, precision,
quantization), so a restart does not measure again.

Imports torch, so it runs in the training worker or a subprocess, never in the
supervisor.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import time
from dataclasses import replace
from pathlib import Path

from p2ptrain.daemon.plan import QUANTIZATION_ORDER, Plan, PlanError, largest_divisor_at_most
from p2ptrain.peers.out_of_memory import is_out_of_memory

logger = logging.getLogger(__name__)

CACHE_FILE = "plans.json"


def cache_key(model: str, device_name: str, precision: str, quantization: str) -> str:
    """The cache key of a measurement: one per model, device, precision and quantization."""
    return "|".join((model, device_name, precision, quantization))


def read_cache(cache_dir: Path) -> dict:
    """The cached measurements ({} when there are none or the file is damaged)."""
    try:
        data = json.loads((Path(cache_dir) / CACHE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_cache(cache_dir: Path, cache: dict) -> None:
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    temporary = cache_dir / f".{CACHE_FILE}.{os.getpid()}.tmp"
    temporary.write_text(json.dumps(cache, indent=2, sort_keys=True))
    temporary.replace(cache_dir / CACHE_FILE)  # atomic: a reader never sees half a file


def back_off(plan: Plan, start_micro_batch: int, can_quantize: bool) -> Plan | None:
    """The next plan to try after `plan` ran out of memory, or None when nothing smaller is left.

    Halves the micro-batch while it is above one (keeping the samples per
    step); at one, moves to the next stronger quantization and starts again
    from `start_micro_batch`, if `can_quantize` (a CUDA device and LoRA).
    """
    samples_per_step = plan.samples_per_step
    if plan.micro_batch > 1:
        micro_batch = largest_divisor_at_most(samples_per_step, plan.micro_batch // 2)
        reason = f"back-off: out of memory at micro-batch {plan.micro_batch}, trying {micro_batch}"
        return replace(plan, micro_batch=micro_batch, grad_accum=samples_per_step // micro_batch,
                       rationale=[*plan.rationale, reason])
    stronger = QUANTIZATION_ORDER.index(plan.quantization) + 1
    if not can_quantize or stronger >= len(QUANTIZATION_ORDER):
        return None
    quantization = QUANTIZATION_ORDER[stronger]
    reason = f"back-off: out of memory at micro-batch 1 in {plan.quantization}, trying {quantization}"
    return replace(plan, quantization=quantization, micro_batch=start_micro_batch,
                   grad_accum=samples_per_step // start_micro_batch, rationale=[*plan.rationale, reason])


def measure_samples_per_second(model: str, plan: Plan, lora: dict | None, steps: int, seed: int = 0) -> float:
    """Train `steps` real steps (forward, backward, AdamW) on random tokens at the plan's micro-batch.

    One warm-up step first (allocator, kernels); the steps after it are timed.
    Raises torch's out-of-memory errors as they come.
    """
    import torch

    from p2ptrain.peers.models import build_model, causal_lm_loss

    torch.set_num_threads(plan.cpu_threads)
    loaded = build_model(model, lora=lora, precision=plan.precision, quantization=plan.quantization,
                         device=plan.device, seed=seed)
    try:
        optimizer = torch.optim.AdamW(loaded.trainable(), lr=1e-5)
        generator = torch.Generator().manual_seed(seed)
        vocab = loaded.model.get_input_embeddings().num_embeddings
        batch = torch.randint(0, vocab, (plan.micro_batch, plan.seq_len), generator=generator)

        def step() -> None:
            loss = causal_lm_loss(loaded.model, batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        step()
        _synchronize(plan.device)
        started = time.perf_counter()
        for _ in range(steps):
            step()
        _synchronize(plan.device)
        return plan.micro_batch * steps / (time.perf_counter() - started)
    finally:
        del loaded
        _release_memory(plan.device)


def _synchronize(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def _release_memory(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


def calibrate(model: str, plan: Plan, cache_dir: Path, steps: int = 3, lora: dict | None = None,
              use_cache: bool = True) -> Plan:
    """Confirm `plan` with real steps; return it (or the smaller plan that fit) with `samples_per_second`.

    Args:
        model: the model name the plan is for (as `build_model` takes it).
        plan: from `make_plan`.
        cache_dir: where `plans.json` lives (the daemon's cache directory).
        steps: timed steps after one warm-up step.
        lora: the manifest's LoRA settings, None for full training.
        use_cache: reuse a cached measurement of the same micro-batch and seq_len.

    Raises:
        PlanError: out of memory even at micro-batch 1 with the strongest quantization allowed.
    """
    key = cache_key(model, plan.device_name, plan.precision, plan.quantization)
    cache = read_cache(cache_dir)
    cached = cache.get(key)
    if (use_cache and isinstance(cached, dict) and cached.get("seq_len") == plan.seq_len
            and cached.get("micro_batch") == plan.micro_batch):
        return replace(plan, samples_per_second=cached["samples_per_second"], calibrated=True,
                       rationale=[*plan.rationale, f"measured {cached['samples_per_second']:.2f} samples/s "
                                  f"(cached {time.strftime('%Y-%m-%d', time.localtime(cached['measured_at']))})"])
    can_quantize = plan.device.startswith("cuda") and lora is not None and model != "tiny"
    current = plan
    while True:
        try:
            samples_per_second = measure_samples_per_second(model, current, lora, steps)
            break
        except Exception as error:
            if not is_out_of_memory(error):
                raise
            message = str(error).splitlines()[0] if str(error) else type(error).__name__
        # Outside the except block, so the failed step's tensors (held by the traceback) can be freed.
        logger.warning("out of memory at micro-batch %d (%s): %s", current.micro_batch, current.quantization,
                       message)
        _release_memory(current.device)
        smaller = back_off(current, plan.micro_batch, can_quantize)
        if smaller is None:
            raise PlanError(f"{model} runs out of memory on {plan.device_name} even at micro-batch 1 in "
                            f"{current.quantization}", "use a device with more free memory, a smaller model "
                            "or a shorter seq_len")
        current = smaller
    key = cache_key(model, current.device_name, current.precision, current.quantization)
    cache = read_cache(cache_dir)
    cache[key] = {"samples_per_second": samples_per_second, "micro_batch": current.micro_batch,
                  "seq_len": current.seq_len, "measured_at": time.time()}
    _write_cache(cache_dir, cache)
    return replace(current, samples_per_second=samples_per_second, calibrated=True,
                   rationale=[*current.rationale, f"measured {samples_per_second:.2f} samples/s over {steps} steps"])
