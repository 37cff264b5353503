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


def measure_bare_loop(steps: int, seq_len: int = 128, micro_batch: int = 8, cache_dir: Path | None = None,
                      optimizer_every: int = 1) -> float:
    """Samples per second of `steps` training steps (forward, backward) on the tiny model.

    A few warm-up steps (allocator, first kernels) are run first and not timed;
    tokenizing the corpus (cached in `cache_dir`, a temporary directory if None)
    is not timed either. `optimizer_every`: an AdamW step every this many steps
    (1: every step); 0: never, the gradients accumulate, as a sync peer's do
    between the epochs of its run.
    """
    if steps < 1:
        raise ValueError(f"steps must be at least 1, not {steps}")
    if optimizer_every < 0:
        raise ValueError(f"optimizer_every must be 0 (never) or more, not {optimizer_every}")
    with tempfile.TemporaryDirectory() as scratch:
        cache = Path(cache_dir) if cache_dir is not None else Path(scratch)
        loaded = build_model(TINY_PRESET)
        batches = train_batches(DEFAULT_DATASET, loaded.tokenizer, seq_len, micro_batch, seed=0, cache_dir=cache)
        optimizer = torch.optim.AdamW(loaded.trainable(), lr=1e-3)

        def step(number: int) -> None:
            loss = causal_lm_loss(loaded.model, next(batches))
            loss.backward()
            if optimizer_every and number % optimizer_every == 0:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

        for number in range(1, WARMUP_STEPS + 1):
            step(number)
        started = time.perf_counter()
        for number in range(1, steps + 1):
            step(number)
        elapsed = time.perf_counter() - started
    return steps * micro_batch / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50, help="timed optimizer steps")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per sample")
    parser.add_argument("--micro-batch", type=int, default=8, help="samples per step")
    parser.add_argument("--cache-dir", type=Path, default=None, help="token cache (default: a temporary directory)")
    parser.add_argument("--optimizer-every", type=int, default=1, help="an AdamW step every N steps (0: never; default 1)")
    args = parser.parse_args()
    samples_per_second = measure_bare_loop(args.steps, args.seq_len, args.micro_batch, args.cache_dir, args.optimizer_every)
    print(json.dumps({
        "benchmark": "bare_loop",
        "samples_per_second": round(samples_per_second, 2),
        "steps": args.steps,
        "seq_len": args.seq_len,
        "micro_batch": args.micro_batch,
        "optimizer_every": args.optimizer_every,
        "torch_threads": torch.get_num_threads(),
    }))


if __name__ == "__main__":
    main()
