"""Telling an out-of-memory error from other failures, on the GPU and on the CPU.

The training worker exits with ``OUT_OF_MEMORY_EXIT_CODE`` on one (the daemon
then restarts it with half the micro-batch); calibration backs off to a
smaller plan. Imports torch inside the function.
"""

from __future__ import annotations

# Phrases of allocation failures that torch raises as plain RuntimeError:
# CUDA's caching allocator (older torch) and the CPU allocator.
_OOM_PHRASES = ("out of memory", "can't allocate memory", "cannot allocate memory")


def is_out_of_memory(error: BaseException) -> bool:
    """True for allocation failures on the GPU or the CPU."""
    import torch

    if isinstance(error, torch.OutOfMemoryError):
        return True
    return isinstance(error, RuntimeError) and any(phrase in str(error).lower() for phrase in _OOM_PHRASES)
