"""What the divergence guard costs a run that never diverges (issue 24; goal <= 1 %).

    nice -n 10 .venv/bin/python benchmarks/guard_cost.py [--steps 300] [--model tiny|small-llama] [--out FILE.jsonl]
    .venv/bin/python benchmarks/guard_cost.py --report benchmarks/guard_cost_runs.jsonl

The guard (``p2ptrain.peers.training.divergence``) adds to a worker that never diverges:

- at every step, ``DivergenceGuard.observe`` of the step's loss (a median and a median
  absolute deviation over the last 50 losses);
- at every checkpoint, ``checkpoint.non_finite_problem`` over the whole state to be saved
  (the trainable parameters and the trainer's state: what a restore would adopt);
- once, the checkpoint at the start of training (a good state to roll back to).

Measured here on a real training loop (the tiny preset, or LoRA over the tests' small
Llama, plain AdamW on the stdlib corpus): the mean time of a training step (forward,
backward, optimizer step), of ``observe`` on that loop's losses, of the finiteness check
of a checkpoint state as the worker builds it, and of saving that state. The cost is
``observe`` per step plus the check amortized over the steps between two checkpoints at
the default interval (``training.checkpoint_interval_s``, 600 s). Timing the components
rather than two whole runs: on a shared machine two runs differ by more than 1 % by
themselves. Each run appends a JSON line to ``--out`` with the machine and load
(``run_facts.py``); ``--report`` prints the table of ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from p2ptrain.config import TrainingSettings
from p2ptrain.peers.model.checkpoint import non_finite_problem, save_checkpoint
from p2ptrain.peers.model.data import train_batches
from p2ptrain.peers.training.divergence import DivergenceGuard
from p2ptrain.peers.model.models import build_model, causal_lm_loss

from diloco_study import small_llama  # benchmarks/diloco_study.py, beside this script
from run_facts import facts  # benchmarks/run_facts.py

HERE = Path(__file__).resolve().parent
WARMUP_STEPS = 5


def measure(model: str, steps: int, micro_batch: int, seq_len: int, cache_dir: Path) -> dict:
    """One loop of ``steps`` timed steps; returns the row's measurements (seconds)."""
    if model == "small-llama":
        loaded = build_model(str(small_llama(cache_dir)), lora={"r": 8, "alpha": 16, "dropout": 0.0})
        dataset = {"kind": "files", "paths": [str(cache_dir / "small-corpus.txt")]}
    else:
        loaded, dataset = build_model("tiny"), {"kind": "stdlib"}
    optimizer = torch.optim.AdamW(loaded.trainable(), lr=1e-3)
    batches = train_batches(dataset, loaded.tokenizer, seq_len, micro_batch, seed=0, cache_dir=cache_dir)
    step_seconds, losses = [], []
    for step in range(WARMUP_STEPS + steps):
        started = time.perf_counter()
        loss = causal_lm_loss(loaded.model, next(batches))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        value = loss.item()
        if step >= WARMUP_STEPS:
            step_seconds.append(time.perf_counter() - started)
            losses.append(value)
    guard = DivergenceGuard()
    started = time.perf_counter()
    for value in losses:
        guard.observe(value)
    observe_s = (time.perf_counter() - started) / len(losses)
    # the state a worker saves: trainable parameters and its trainer's (here the optimizer's) state
    state = {"trainable": loaded.trainable_state(), "trainer": {"inner_optimizer": optimizer.state_dict()}}
    check_s = min(_timed(lambda: non_finite_problem(state)) for _ in range(5))
    with tempfile.TemporaryDirectory() as scratch:
        save_s = min(_timed(lambda: save_checkpoint(Path(scratch) / "run.pt", state)) for _ in range(3))
    return {"step_s": statistics.mean(step_seconds), "observe_s": observe_s, "check_s": check_s, "save_s": save_s,
            "trainable_parameters": loaded.trainable_parameters}


def _timed(work) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def cost(row: dict, checkpoint_interval_s: float) -> float:
    """The guard's share of a never-diverging run's time: ``observe`` per step, the check per checkpoint."""
    steps_between_checkpoints = checkpoint_interval_s / row["step_s"]
    return (row["observe_s"] + row["check_s"] / steps_between_checkpoints) / row["step_s"]


def report(paths: list[Path]) -> str:
    rows = [json.loads(line) for path in paths for line in path.read_text().splitlines() if line.strip()]
    interval = TrainingSettings().checkpoint_interval_s
    lines = ["| model | trainable parameters | step | `observe` a step | finiteness check a checkpoint | saving it | "
             f"guard's cost (checkpoint every {interval:.0f} s) | load before / after | commit |",
             "|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for row in rows:
        lines.append(f"| {row['model']} (B {row['micro_batch']}, seq_len {row['seq_len']}) | {row['trainable_parameters']:,} | "
                     f"{1000 * row['step_s']:.1f} ms | {1e6 * row['observe_s']:.0f} µs | {1000 * row['check_s']:.1f} ms | "
                     f"{1000 * row['save_s']:.1f} ms | {100 * cost(row, interval):.2f} % | "
                     f"{row['load'][0]:.1f} / {row['load_after'][0]:.1f} | {row['commit'][:9]} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["tiny", "small-llama"], default="tiny")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--cache-dir", type=Path, default=Path("/tmp/p2ptrain-study-cache"))
    parser.add_argument("--out", type=Path, default=HERE / "guard_cost_runs.jsonl")
    parser.add_argument("--report", type=Path, nargs="*", help="print the table of RESULTS.md from these JSONL files")
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
        return
    torch.set_num_threads(1)
    before = facts()
    row = {"benchmark": "guard_cost", "model": args.model, "steps": args.steps, "micro_batch": args.micro_batch,
           "seq_len": args.seq_len, **measure(args.model, args.steps, args.micro_batch, args.seq_len, args.cache_dir),
           **before, "load_after": facts()["load"]}
    with args.out.open("a") as file:
        file.write(json.dumps(row) + "\n")
    print(json.dumps(row))


if __name__ == "__main__":
    main()
