"""The speed of a bare PyTorch training loop on the tiny preset, with no p2ptrain around it.

The baseline for a daemon-run peer: a plain AdamW loop over the stdlib corpus,
at the same sequence length and micro-batch. Prints one JSON line:

    .venv/bin/python benchmarks/bare_loop.py --steps 50
    {"benchmark": "bare_loop", "samples_per_second": 95.1, "steps": 50, ...}
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from p2ptrain.peers.model.data import DEFAULT_DATASET, train_batches
from p2ptrain.peers.model.models import TINY_PRESET, build_model, causal_lm_loss

WARMUP_STEPS = 3


def measure_bare_loop(steps: int, seq_len: int = 128, micro_batch: int = 8, cache_dir: Path | None = None) -> float:
    """Samples per second of `steps` AdamW steps on the tiny model.

    A few warm-up steps (allocator, first kernels) are run first and not timed;
    tokenizing the corpus (cached in `cache_dir`, a temporary directory if None)
    is not timed either.
    """
    if steps < 1:
        raise ValueError(f"steps must be at least 1, not {steps}")
    with tempfile.TemporaryDirectory() as scratch:
        cache = Path(cache_dir) if cache_dir is not None else Path(scratch)
        loaded = build_model(TINY_PRESET)
        batches = train_batches(DEFAULT_DATASET, loaded.tokenizer, seq_len, micro_batch, seed=0, cache_dir=cache)
        optimizer = torch.optim.AdamW(loaded.trainable(), lr=1e-3)

        def step() -> None:
            loss = causal_lm_loss(loaded.model, next(batches))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        for _ in range(WARMUP_STEPS):
            step()
        started = time.perf_counter()
        for _ in range(steps):
            step()
        elapsed = time.perf_counter() - started
    return steps * micro_batch / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50, help="timed optimizer steps")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per sample")
    parser.add_argument("--micro-batch", type=int, default=8, help="samples per step")
    parser.add_argument("--cache-dir", type=Path, default=None, help="token cache (default: a temporary directory)")
    args = parser.parse_args()
    samples_per_second = measure_bare_loop(args.steps, args.seq_len, args.micro_batch, args.cache_dir)
    print(json.dumps({
        "benchmark": "bare_loop",
        "samples_per_second": round(samples_per_second, 2),
        "steps": args.steps,
        "seq_len": args.seq_len,
        "micro_batch": args.micro_batch,
        "torch_threads": torch.get_num_threads(),
    }))


if __name__ == "__main__":
    main()
