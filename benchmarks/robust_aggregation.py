"""What robust aggregation costs when nobody misbehaves, and what it saves when a rogue joins.

    nice -n 19 .venv/bin/python benchmarks/robust_aggregation.py [--rounds 16] [--local-steps 10] \
        [--rogue-from 5] [--rogue-rounds 3] --json benchmarks/robust_aggregation_<date>.jsonl
    .venv/bin/python benchmarks/robust_aggregation.py --report benchmarks/robust_aggregation_<date>.jsonl

The same exact DiLoCo simulation as ``diloco_study.py`` (4 replicas of the
``tiny`` model in one process, one AdamW state and data stream each, outer
Nesterov SGD lr 0.7 momentum 0.9: the manifest's defaults, no compression), run
five times from the same start on the same data:

- ``plain``: each part of the pseudo-gradients reduced by hivemind's weighted mean;
- ``robust``: each part reduced by ``robust_reduce.robust_aggregate`` with the
  options DiLoCo's averager uses, the reducer being the replica hivemind would
  give that part to;
- ``plain, each average x (1 + 1e-7 noise)``: how far float rounding alone moves
  the curves (a robust average differs from the mean by that much);
- ``plain + rogue`` and ``robust + rogue``: for ``--rogue-rounds`` rounds from
  round ``--rogue-from`` on, replica 0 sends large random pseudo-gradients
  instead of its own (standard normal values, hundreds of times an honest
  one's, the attack issue 14 measured on real peers) --
  as a sender only: the swarm tests (``tests/integration/test_faults_rogue.py``)
  cover a rogue that also reduces.

Each invocation appends one JSON line to ``--json``: its arguments, the facts of
the run (``run_facts.py``: commit, date, machine, load at the start; ``load_after``
at the end), its minutes, and per run every round's eval loss (256 fixed
validation windows; the first before any round), reducer CPU seconds (one
thread) and pieces the reducers named, and for ``robust`` how far its average
was from the plain mean each round. ``--report`` renders RESULTS.md's table
(``results.py``: ``robust-aggregation``) and the figures below it from that file.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from p2ptrain.peers.model.data import train_batches, validation_batches
from p2ptrain.peers.model.models import build_model, causal_lm_loss, mean_loss
from p2ptrain.peers.robust.reduce import RobustOptions, plausible_weight, robust_aggregate
from p2ptrain.peers.worker.run_setup import stream_seed

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from run_facts import facts  # noqa: E402  (benchmarks/run_facts.py)

DATASET = {"kind": "stdlib"}
SEED = 1
REPLICAS = 4
EVAL_BATCH, EVAL_BATCHES = 8, 32
PART_VALUES = 2**19 // 4  # hivemind's part size (512 KiB) in float32 values
ROUNDING_RUN = "plain, each average x (1 + 1e-7 noise)"


def parts_by_reducer(tensors: list[torch.Tensor], reducers: int) -> list[tuple[int, int, int, int]]:
    """(reducer, tensor index, start, end) of each part: hivemind's split (each tensor in parts of
    ``PART_VALUES``; contiguous equal shares of the flat vector, one per reducer)."""
    total = sum(tensor.numel() for tensor in tensors)
    parts, position = [], 0
    for index, tensor in enumerate(tensors):
        for start in range(0, tensor.numel(), PART_VALUES):
            end = min(start + PART_VALUES, tensor.numel())
            parts.append((min(reducers - 1, position * reducers // total), index, start, end))
            position += end - start
    return parts


def average(pseudo: list[list[torch.Tensor]], weights: list[float], robust: RobustOptions | None) -> tuple[list[torch.Tensor], float, int]:
    """The averaged pseudo-gradients, the seconds the reducers took, and how many senders they named."""
    averaged = [torch.empty_like(tensor) for tensor in pseudo[0]]
    named = 0
    started = time.process_time()
    for reducer, index, start, end in parts_by_reducer(pseudo[0], len(pseudo)):
        pieces = {sender: tensors[index].reshape(-1)[start:end] for sender, tensors in enumerate(pseudo)}
        if robust is None:
            total = sum(weights)
            result = sum(piece * weight for piece, weight in zip(pieces.values(), weights)) / total
        else:
            aggregate = robust_aggregate(pieces, dict(enumerate(weights)), own=reducer, options=robust)
            result, named = aggregate.result, named + len(aggregate.suspects)
        averaged[index].reshape(-1)[start:end] = result
    return averaged, time.process_time() - started, named


def simulate(args, windows: list, robust: bool, rogue: bool, rounding: float = 0.0) -> dict:
    """One run (see the module doc); ``rounding``: each averaged value is multiplied by
    ``1 + rounding * N(0, 1)``, to show how far float rounding alone moves the curves."""
    loaded = build_model("tiny", seed=SEED)
    model, parameters = loaded.model, loaded.trainable()
    global_parameters = [parameter.detach().clone() for parameter in parameters]
    outer = torch.optim.SGD(global_parameters, lr=0.7, momentum=0.9, nesterov=True)
    states = [torch.optim.AdamW(parameters, lr=args.inner_lr).state_dict() for _ in range(REPLICAS)]
    streams = [train_batches(DATASET, loaded.tokenizer, args.seq_len, args.micro_batch, stream_seed(SEED, f"replica{index}"), args.cache_dir)
               for index in range(REPLICAS)]
    samples = args.local_steps * args.micro_batch
    options = RobustOptions.for_pseudo_gradients(plausible_weight(samples), args.inner_lr, 1.0, len(parameters))
    noise = torch.Generator().manual_seed(SEED)
    losses, reduce_seconds, deviations, named = [mean_loss(model, windows)], [], [], []
    for round_index in range(args.rounds):
        pseudo = []
        for replica in range(REPLICAS):
            with torch.no_grad():
                for parameter, global_parameter in zip(parameters, global_parameters):
                    parameter.copy_(global_parameter)
            optimizer = torch.optim.AdamW(parameters, lr=args.inner_lr)
            optimizer.load_state_dict(states[replica])
            for _ in range(args.local_steps):
                causal_lm_loss(model, next(streams[replica])).backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            states[replica] = optimizer.state_dict()
            pseudo.append([global_parameter - parameter.detach() for global_parameter, parameter in zip(global_parameters, parameters)])
        if rogue and args.rogue_from <= round_index < args.rogue_from + args.rogue_rounds:
            pseudo[0] = [torch.randn(tensor.shape, generator=noise) for tensor in pseudo[0]]
        averaged, seconds, round_named = average(pseudo, [float(samples)] * REPLICAS, options if robust else None)
        if rounding:
            averaged = [tensor * (1 + rounding * torch.randn(tensor.shape, generator=noise)) for tensor in averaged]
        reduce_seconds.append(seconds)
        named.append(round_named)
        if robust and not rogue:
            mean, _, _ = average(pseudo, [float(samples)] * REPLICAS, None)
            deviations.append(float(torch.cat([(a - m).reshape(-1) for a, m in zip(averaged, mean)]).norm()
                                    / torch.cat([m.reshape(-1) for m in mean]).norm()))
        for global_parameter, update in zip(global_parameters, averaged):
            global_parameter.grad = update
        outer.step()
        outer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for parameter, global_parameter in zip(parameters, global_parameters):
                parameter.copy_(global_parameter)
        losses.append(mean_loss(model, windows))
        print(f"{'robust' if robust else 'plain'}{' + rogue' if rogue else ''} round {round_index + 1}: eval loss {losses[-1]:.4f}",
              file=sys.stderr, flush=True)
    return {"losses": losses, "reduce_seconds": reduce_seconds, "named": named, "deviations": deviations}


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def change(loss: float, reference: float) -> float:
    """``loss`` against ``reference``, in %."""
    return 100 * (loss - reference) / reference


def loads(values: list[float]) -> str:
    return " / ".join(f"{value:.1f}" for value in values)


def render_run(row: dict) -> str:
    """One invocation's line of ``--json``: its facts, the table and the figures below it."""
    args, runs, run_facts = row["args"], row["runs"], row["facts"]
    rounds, before = args["rounds"], args["rogue_from"]
    after = before + args["rogue_rounds"]
    later = min(after + 2, rounds)
    command = (f"--rounds {rounds} --local-steps {args['local_steps']} --rogue-from {before} --rogue-rounds {args['rogue_rounds']}")
    commit = run_facts["commit"][:7] + (" (with uncommitted changes)" if run_facts["commit"].endswith("-dirty") else "")
    attacked = f"round {after}" if after == before + 1 else f"rounds {before + 1}-{after}"
    lines = [f"`robust_aggregation.py {command}` at {commit}, {run_facts['date'][:16].replace('T', ' ')} UTC, "
             f"{run_facts['machine']['cores']} cores, load {loads(run_facts['load'])} (1 / 5 / 15 min) at the start, "
             f"{loads(row['load_after'])} at the end, {row['minutes']:.0f} min:", "",
             f"| run | eval loss after round {before} (before the rogue) | after round {after} (its last) | after round {later} | "
             f"after round {rounds} (end) | reducer CPU s per round | pieces left out or named |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, run in runs.items():
        losses = run["losses"]
        lines.append(f"| {name} | {losses[before]:.4f} | {losses[after]:.4f} | {losses[later]:.4f} | {losses[-1]:.4f} | "
                     f"{mean(run['reduce_seconds']):.3f} | {sum(run['named'])} |")
    plain, robust, rounded = (runs[name]["losses"] for name in ("plain", "robust", ROUNDING_RUN))
    apart = max(abs(change(r, p)) for r, p in zip(robust[1:], plain[1:]))
    noise = max(abs(change(r, p)) for r, p in zip(rounded[1:], plain[1:]))
    deviations = runs["robust"]["deviations"]
    plain_cpu, robust_cpu = mean(runs["plain"]["reduce_seconds"]), mean(runs["robust"]["reduce_seconds"])
    rogue, robust_rogue = runs["plain + rogue"]["losses"], runs["robust + rogue"]["losses"]
    lines += ["",
              f"- Nobody misbehaving: the robust average is at most {max(deviations):.2g} ({mean(deviations):.2g} on average) "
              f"of the plain mean's norm away from it over the {len(deviations)} rounds. Eval loss robust against plain: "
              f"{change(robust[-1], plain[-1]):+.2f} % at the end, at most {apart:.2f} % apart over the rounds; the plain run with "
              f"rounding-level noise against plain: {change(rounded[-1], plain[-1]):+.2f} % at the end, at most {noise:.2f} % apart "
              + (f"(robust's largest gap {apart / noise:.2f}x rounding's)." if noise else "(rounding alone moved nothing)."),
              f"- Cost: the reducers' CPU per round {plain_cpu:.3f} s plain, {robust_cpu:.3f} s robust "
              f"({robust_cpu / max(plain_cpu, 1e-9):.1f}x, +{robust_cpu - plain_cpu:.3f} s a round for {row['parameters']:,} "
              f"parameters, all {row['replicas']} reducers on one thread: +{(robust_cpu - plain_cpu) / row['replicas']:.3f} s "
              "per peer and round).",
              f"- A rogue in {attacked}: the plain mean goes from {rogue[before]:.2f} to {rogue[after]:.2f} "
              f"(at most {max(rogue):.2f}, {rogue[-1]:.2f} at the end); the robust reducers named "
              f"{sum(runs['robust + rogue']['named'])} pieces and end at {robust_rogue[-1]:.4f}, "
              f"{change(robust_rogue[-1], robust[-1]):+.2f} % against the robust run without the rogue."]
    return "\n".join(lines)


def report(path: Path) -> str:
    """Every invocation of ``path`` (``--json``) rendered by ``render_run``."""
    return "\n\n".join(render_run(json.loads(line)) for line in path.read_text().splitlines() if line.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--local-steps", type=int, default=10, help="H")
    parser.add_argument("--micro-batch", type=int, default=4, help="B")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--inner-lr", type=float, default=3e-3)
    parser.add_argument("--rogue-from", type=int, default=5, help="the rogue's first round (0-based)")
    parser.add_argument("--rogue-rounds", type=int, default=3)
    parser.add_argument("--cache-dir", type=Path, default=Path("/tmp/p2ptrain-study-cache"))
    parser.add_argument("--json", type=Path, help="append the invocation's row (see the docstring) to this JSON-lines file")
    parser.add_argument("--report", type=Path, help="print the table of this file and exit")
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
        return
    torch.set_num_threads(1)
    run_facts = facts()
    started = time.monotonic()
    loaded = build_model("tiny", seed=SEED)
    windows = validation_batches(DATASET, loaded.tokenizer, args.seq_len, EVAL_BATCH, args.cache_dir, EVAL_BATCHES)
    runs = {name: simulate(args, windows, robust=robust, rogue=rogue, rounding=rounding) for name, robust, rogue, rounding in
            (("plain", False, False, 0.0), ("robust", True, False, 0.0), (ROUNDING_RUN, False, False, 1e-7),
             ("plain + rogue", False, True, 0.0), ("robust + rogue", True, True, 0.0))}
    row = {"args": {key: value for key, value in vars(args).items() if key not in ("cache_dir", "json", "report")},
           "replicas": REPLICAS, "parameters": sum(parameter.numel() for parameter in loaded.trainable()), "runs": runs,
           "minutes": (time.monotonic() - started) / 60, "facts": run_facts, "load_after": facts()["load"]}
    if args.json:
        with args.json.open("a") as output:
            output.write(json.dumps(row) + "\n")
    print(render_run(row))


if __name__ == "__main__":
    main()
