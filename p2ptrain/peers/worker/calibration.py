"""Confirming the plan before the first step: real forward/backward passes, searching both ways.

The daemon's plan is memory arithmetic; real steps settle it. The worker calls
``calibrate`` once the model is built and before it joins the averaging, so a
micro-batch that does not fit costs no averaging round. Each size gets one
warm-up pass (allocator, kernels) and a few timed ones.

- Down: on an out-of-memory error the micro-batch is halved
  (``halved_micro_batch``, the back-off the daemon also uses when a worker runs
  out of memory later) and tried again; at micro-batch 1 the worker gives up
  with ``out_of_memory_failure``.
- Up: when the plan's micro-batch fits, the next larger one that divides the
  step's samples (about twice as many) is tried, and kept while it fits the
  memory cap and is at least ``GROWTH_GAIN`` faster; at most ``MAX_SIZES``
  sizes in all. A size whose peak, extrapolated from the last one, would
  pass the cap is not tried (on the CPU a real overrun could wake the kernel's
  OOM killer rather than raise).

Peak memory is what the device's allocator reserved (CUDA), or the process's
peak resident set (the CPU: ``VmHWM``, reset before each pass). The gradients
are dropped afterwards: the model is as it was. The result goes to the plan
cache (``plan_cache.py``). torch is imported inside the functions.
"""

from __future__ import annotations

import gc
import logging
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path

from p2ptrain.peers.worker.out_of_memory import is_out_of_memory
from p2ptrain.peers.worker.run_setup import WorkerFailure
from p2ptrain.worker_pipe import halved_micro_batch

logger = logging.getLogger(__name__)

TIMED_PASSES = 2
# Timed passes go on until this long has passed (a tiny model's pass takes milliseconds: one
# scheduler hiccup would decide), at most MAX_TIMED_PASSES.
MIN_TIMED_S = 0.3
MAX_TIMED_PASSES = 50
# A larger micro-batch is kept only if it trains at least this much faster (noise and the
# larger step's coarser accumulation are not worth less).
GROWTH_GAIN = 1.10
MAX_SIZES = 5


@dataclass(frozen=True)
class Calibration:
    """What the real passes showed.

    Attributes:
        micro_batch, grad_accum: what was chosen (the plan's, halved from it, or grown).
        samples_per_second: forward/backward speed at ``micro_batch``.
        out_of_memory_at: the micro-batches that did not fit, in the order tried.
        speeds: samples/s of every micro-batch that fit, by micro-batch.
        peak_bytes: peak memory of every micro-batch that fit, by micro-batch.
        planned: the micro-batch the plan said.
    """

    micro_batch: int
    grad_accum: int
    samples_per_second: float
    out_of_memory_at: tuple[int, ...] = ()
    speeds: dict[int, float] = field(default_factory=dict)
    peak_bytes: dict[int, int] = field(default_factory=dict)
    planned: int | None = None

    def words(self) -> str:
        """One line for the ``calibrated`` event."""
        line = f"micro-batch {self.micro_batch} x {self.grad_accum} fits"
        if self.out_of_memory_at and self.planned is not None and self.micro_batch < self.planned:
            line += f" after running out of memory at micro-batch {', '.join(map(str, self.out_of_memory_at))}"
        elif self.planned is not None and self.micro_batch > self.planned:
            steps = " -> ".join(f"{size} ({self.speeds[size]:.1f}/s)" for size in sorted(self.speeds) if size <= self.micro_batch)
            line += f", grown from the plan's {self.planned} while at least {GROWTH_GAIN - 1:.0%} faster: {steps}"
        return f"{line}: {self.samples_per_second:.2f} samples/s forward and backward"

    def to_cache(self, seq_len: int) -> dict:
        """The plan cache's entry (``plan_cache.record_measurement``)."""
        return {
            "samples_per_second": self.samples_per_second, "micro_batch": self.micro_batch, "grad_accum": self.grad_accum,
            "seq_len": seq_len, "out_of_memory_at": list(self.out_of_memory_at),
            "speeds": {str(size): speed for size, speed in self.speeds.items()},
        }


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


def next_micro_batch(micro_batch: int, samples_per_step: int) -> int | None:
    """The next size to try when growing: the smallest divisor of the step's samples at least twice
    ``micro_batch`` (else the step itself), or None when ``micro_batch`` already takes the whole step."""
    if micro_batch >= samples_per_step:
        return None
    for size in range(2 * micro_batch, samples_per_step + 1):
        if samples_per_step % size == 0:
            return size
    return samples_per_step


def calibrate(model, name: str, device: str, micro_batch: int, grad_accum: int, seq_len: int,
              memory_cap_bytes: int | None = None, timed_passes: int = TIMED_PASSES,
              max_micro_batch: int | None = None) -> Calibration:
    """Real forward/backward passes from the plan's ``micro_batch``: halved until they fit, then grown while faster.

    Args:
        model: the worker's model (its weights are left as they were; its gradients are dropped).
        name: the model's name, for the error message.
        device: where the model is (``cpu``, ``cuda:0``).
        micro_batch, grad_accum: the plan's; their product, the step's samples, stays.
        seq_len: tokens per sample (the manifest's).
        memory_cap_bytes: the peak a grown micro-batch may reach (the plan's cap: the allocator's on
            a GPU, the process's resident set on the CPU); None: grow only until out of memory.
        timed_passes: the fewest passes timed after the warm-up one, per size (more until
            ``MIN_TIMED_S`` has passed).
        max_micro_batch: the largest size growing may reach (the daemon's bound after a training
            step ran out of memory: a few passes can fit where training does not); None: no bound.

    Raises:
        WorkerFailure: out of memory even at micro-batch 1.
    """
    samples_per_step, planned = micro_batch * grad_accum, micro_batch
    failed: list[int] = []
    while True:
        try:
            speed, peak, baseline = _measure(model, device, micro_batch, seq_len, timed_passes)
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
    speeds, peaks = {micro_batch: speed}, {micro_batch: peak}
    if not failed:
        micro_batch, speed = _grow(model, name, device, micro_batch, samples_per_step, seq_len, memory_cap_bytes,
                                   timed_passes, baseline, speeds, peaks, failed, max_micro_batch)
    return Calibration(micro_batch, samples_per_step // micro_batch, speed, tuple(failed), speeds, peaks, planned)


def _grow(model, name: str, device: str, micro_batch: int, samples_per_step: int, seq_len: int,
          memory_cap_bytes: int | None, timed_passes: int, baseline: int, speeds: dict, peaks: dict,
          failed: list[int], max_micro_batch: int | None) -> tuple[int, float]:
    """Try larger micro-batches, up to ``max_micro_batch``, while they fit and are faster; returns the
    chosen size and its speed."""
    speed = speeds[micro_batch]
    while len(speeds) + len(failed) < MAX_SIZES:
        bigger = next_micro_batch(micro_batch, samples_per_step)
        if bigger is None:
            break
        if max_micro_batch is not None and bigger > max_micro_batch:
            logger.info("Not trying micro-batch %d: over the %d allowed since a training step ran out of memory",
                        bigger, max_micro_batch)
            break
        expected = baseline + (peaks[micro_batch] - baseline) * bigger / micro_batch
        if memory_cap_bytes is not None and expected > memory_cap_bytes:
            logger.info("Not trying micro-batch %d: its peak would be ~%.0f MiB, over the cap of %.0f MiB",
                        bigger, expected / 2**20, memory_cap_bytes / 2**20)
            break
        try:
            bigger_speed, bigger_peak, _ = _measure(model, device, bigger, seq_len, timed_passes)
        except Exception as error:
            if not (isinstance(error, MemoryError) or is_out_of_memory(error)):
                raise
            failed.append(bigger)
            logger.info("Micro-batch %d runs out of memory: keeping %d", bigger, micro_batch)
            _release(model, device)
            break
        speeds[bigger], peaks[bigger] = bigger_speed, bigger_peak
        if memory_cap_bytes is not None and bigger_peak > memory_cap_bytes:
            logger.info("Micro-batch %d peaks at %.0f MiB, over the cap of %.0f MiB: keeping %d",
                        bigger, bigger_peak / 2**20, memory_cap_bytes / 2**20, micro_batch)
            break
        if bigger_speed < GROWTH_GAIN * speed:
            logger.info("Micro-batch %d trains %.2f samples/s against %.2f at %d: keeping %d",
                        bigger, bigger_speed, speed, micro_batch, micro_batch)
            break
        micro_batch, speed = bigger, bigger_speed
    return micro_batch, speed


def _measure(model, device: str, micro_batch: int, seq_len: int, timed_passes: int) -> tuple[float, int, int]:
    """(samples/s, peak bytes, bytes in use before the passes) of forward/backward passes at ``micro_batch``."""
    import torch

    from p2ptrain.peers.model.models import causal_lm_loss

    vocab = model.get_input_embeddings().num_embeddings
    generator = torch.Generator().manual_seed(0)
    batch = torch.randint(0, vocab, (micro_batch, seq_len), generator=generator)
    baseline = _reset_peak(device)
    try:
        causal_lm_loss(model, batch).backward()
        _synchronize(device)
        started, passes = time.perf_counter(), 0
        while passes < timed_passes or (time.perf_counter() - started < MIN_TIMED_S and passes < MAX_TIMED_PASSES):
            causal_lm_loss(model, batch).backward()
            _synchronize(device)
            passes += 1
        speed = micro_batch * passes / (time.perf_counter() - started)
        return speed, _peak(device), baseline
    finally:
        _release(model, device)


def _reset_peak(device: str) -> int:
    """Start counting the peak anew; returns the bytes in use now."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_reserved(device)
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM, the peak resident set (Linux >= 4.0)
    except OSError:
        pass
    return _resident_set("VmRSS")


def _peak(device: str) -> int:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.max_memory_reserved(device)
    return _resident_set("VmHWM")


def _resident_set(field_name: str) -> int:
    """``VmRSS`` or ``VmHWM`` of this process in bytes (from /proc; the lifetime peak where that is missing)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


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
