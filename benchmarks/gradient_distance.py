"""How far two honest peers' gradients are from each other, per tensor, in the terms of the
robust reducer's far-from-own check (``RobustOptions.for_gradients``).

    nice -n 10 .venv/bin/python benchmarks/gradient_distance.py --json benchmarks/gradient_distance_<date>.jsonl
    .venv/bin/python benchmarks/gradient_distance.py --report benchmarks/gradient_distance_<date>.jsonl

One process trains the built-in tiny model as two peers would in sync mode: each epoch
both peers compute a gradient over ``--samples`` samples of their own data stream
(micro-batches of 4), and the model takes one AdamW step (lr 3e-3) on their mean. Each
epoch compares peer A's gradient, tensor by tensor (hivemind averages each tensor in
parts of its own), with peer B's: fresh, one epoch stale and two epochs stale (what a
late peer's kept gradients are, ``SyncOptimizer``). For each it takes the worst tensor's
``|B - A|`` over two references: A's own norm of that tensor (the check before the
floor) and ``max(that norm, A's whole-gradient RMS x sqrt(tensor size))`` (the floor,
``RobustOptions.floor_from_whole``). The check names at 10 (``far_from_own``).

Writes one JSON row per epoch (the ratios, the epoch, the facts of the run) to ``--json``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from run_facts import facts  # noqa: E402

AGES = {"fresh": 0, "one epoch stale": 1, "two epochs stale": 2}


def worst_ratios(own: list, other: list, total: int) -> dict[str, float]:
    """The worst tensor's distance over the plain and the floored reference (see the module doc)."""
    rms = math.sqrt(sum(float(tensor.pow(2).sum()) for tensor in own) / total)
    plain = max(float((b - a).norm() / a.norm().clamp_min(1e-30)) for a, b in zip(own, other))
    floored = max(float((b - a).norm()) / max(float(a.norm()), rms * math.sqrt(a.numel()), 1e-30) for a, b in zip(own, other))
    return {"own_norm": round(plain, 3), "floored": round(floored, 3)}


def measure(epochs: int, samples: int, seed: int) -> list[dict]:
    import torch

    from p2ptrain.peers.model.data import train_batches
    from p2ptrain.peers.model.models import build_model, causal_lm_loss

    torch.set_num_threads(1)
    loaded = build_model("tiny", seed=seed)
    parameters = loaded.trainable()
    total = sum(parameter.numel() for parameter in parameters)
    optimizer = torch.optim.AdamW(parameters, lr=3e-3)
    micro_batch = 4
    with tempfile.TemporaryDirectory(prefix="p2ptrain-gradients-") as cache:
        streams = [train_batches({"kind": "stdlib"}, loaded.tokenizer, 64, micro_batch, stream, Path(cache)) for stream in (1, 2)]

        def gradient(stream) -> list:
            summed = [torch.zeros_like(parameter) for parameter in parameters]
            steps = samples // micro_batch
            for _ in range(steps):
                loaded.model.zero_grad()
                causal_lm_loss(loaded.model, next(stream)).backward()
                for total_grad, parameter in zip(summed, parameters):
                    total_grad += parameter.grad / steps
            return summed

        rows, history = [], []
        for epoch in range(epochs):
            own, other = gradient(streams[0]), gradient(streams[1])
            history.append(other)
            row = {"epoch": epoch}
            for name, age in AGES.items():
                if epoch >= age:
                    row[name] = worst_ratios(own, history[-1 - age], total)
            rows.append(row)
            print(json.dumps(row), flush=True)
            optimizer.zero_grad()
            for parameter, mine, theirs in zip(parameters, own, other):
                parameter.grad = (mine + theirs) / 2
            optimizer.step()
    return rows


def report(path: Path) -> str:
    """The worst ratio over the epochs, per age and reference, of each run in ``path``."""
    lines = ["| run | age of B's gradient | worst own-norm ratio | worst floored ratio |", "|---|---|---|---|"]
    for line in path.read_text().splitlines():
        run = json.loads(line)
        facts = run["facts"]
        label = (f"seed {run['seed']}, {run['samples']} samples/peer/epoch ({facts['commit'][:7]}, {facts['date'][:16]}, "
                 f"{facts['machine']['cores']} cores, load {facts['load'][0]:.1f})")
        for name in AGES:
            measured = [row[name] for row in run["epochs"] if name in row]
            lines.append(f"| {label} | {name} | {max(m['own_norm'] for m in measured):.1f} | {max(m['floored'] for m in measured):.1f} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=25)
    parser.add_argument("--samples", type=int, default=32, help="samples per peer per epoch")
    parser.add_argument("--seed", type=int, default=1, help="the model's initial weights")
    parser.add_argument("--json", type=Path, help="append the run's row to this JSON-lines file")
    parser.add_argument("--report", type=Path, help="print the table of this file and exit")
    arguments = parser.parse_args()
    if arguments.report:
        print(report(arguments.report))
        return 0
    run_facts = facts()
    epochs = measure(arguments.epochs, arguments.samples, arguments.seed)
    row = {"seed": arguments.seed, "samples": arguments.samples, "epochs": epochs, "facts": run_facts}
    if arguments.json:
        with arguments.json.open("a") as output:
            output.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
