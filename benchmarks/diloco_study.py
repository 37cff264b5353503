"""What the simulation says: exact DiLoCo math with 4 replicas in one process.

    nice -n 10 .venv/bin/python benchmarks/diloco_study.py [--pretrain-samples 24000] [--total-samples 25600] \
        --run NAME [--run NAME ...] [--out FILE.jsonl]
    .venv/bin/python benchmarks/diloco_study.py --report FILE.jsonl [FILE.jsonl ...]

No hivemind swarm: the same `tiny` model, stdlib corpus, per-replica data
streams, inner AdamW (one per replica, its state kept across outer steps, as
``p2ptrain.peers.training.diloco`` does), the mean of the replicas' pseudo-gradients
(``global - local``) passed through the run's compression as the all-reduce
sends it, and an outer SGD step with Nesterov momentum. Blockwise 8-bit: each
replica's part, then the averaged part. A sparse rung
(``p2ptrain.peers.compression.sparse``): each replica sends what its error
feedback (``p2ptrain.peers.compression.error_feedback``, its residual kept across outer
steps) makes of its pseudo-gradient, the mean of those is what reducers form,
and their answers pass through the union format. The bytes of a sparse round
are the real encoded sizes: each replica's parts ((n-1)/n of its tensors) and
the reducers' answers to it. Baselines are the plain AdamW loops of
``convergence.py``. Every configuration trains on the same total samples.

It exists to choose the sample budget and the learning rates of the real
benchmark (``convergence.py``, real peers) cheaply; each ``--run`` appends one
JSON line to ``--out``, and ``--report`` turns those lines into
``diloco_study_results.md``.

Stability (issue 24: a lone creator's run diverged on a GPU with the paper's outer
step): ``--replicas 1`` simulates a peer alone, ``--model small-llama --lora-r 8``
fine-tunes LoRA adapters over a small saved Llama (``tests/local_models.py``, made
once in the cache) instead of the tiny preset, and each row records the eval loss
before training, whether a value went non-finite, and where and under what load it
ran (``run_facts.py``). ``--stability FILE.jsonl`` prints the table of
``benchmarks/RESULTS.md``: which outer lr, momentum and round size stayed stable.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
import dataclasses
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from hivemind.compression import CompressionInfo

from p2ptrain.peers.compression.ladder import parse_rung
from p2ptrain.peers.compression.sparse import decode, encode_top_k, encode_union
from p2ptrain.peers.model.data import train_batches, validation_batches
from p2ptrain.peers.compression.error_feedback import ErrorFeedback
from p2ptrain.peers.model.models import build_model, causal_lm_loss, mean_loss
from p2ptrain.peers.training.optimizers import learning_rate_factor
from p2ptrain.peers.compression.codecs import Blockwise8Bit
from p2ptrain.peers.worker.run_setup import stream_seed

from convergence import GOALS, pretrained_model  # benchmarks/convergence.py, beside this script
from run_facts import facts  # benchmarks/run_facts.py

HERE = Path(__file__).resolve().parent
DATASET = {"kind": "stdlib"}
SEED = 1
REPLICAS = 4
EVAL_BATCH, EVAL_BATCHES = 8, 32


@dataclass
class Config:
    """One simulated configuration.

    ``kind``: "baseline" (one replica at ``batch_factor`` × B) or "diloco".
    ``schedule``: "constant" or "cosine" (after a linear warm-up over ``warmup_steps``
    inner steps, cosine to 0 at the last step, as ``p2ptrain.peers.training.optimizers``).
    ``compression``: "none", "blockwise8bit" or a sparse rung; ``error_feedback_decay``
    its error feedback's decay.
    """

    name: str
    kind: str
    local_steps: int = 0
    batch_factor: int = 1
    inner_lr: float = 3e-3
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    schedule: str = "constant"
    warmup_steps: int = 0
    compression: str = "blockwise8bit"
    error_feedback_decay: float = 1.0


def learning_rate(config: Config, step: int, total_steps: int) -> float:
    """The (inner) learning rate at ``step`` of ``total_steps``: the product's schedule
    (``p2ptrain.peers.training.optimizers.learning_rate_factor``, cosine decaying to 0 at the end)."""
    return config.inner_lr * learning_rate_factor(step, config.warmup_steps, config.schedule, total_steps)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def pretrained_start(args) -> str:
    """The model every configuration starts from: "tiny" (random weights) or, with
    ``--pretrain-samples``, ``convergence.pretrained_model`` (made once, kept in the cache), or
    with ``--model small-llama`` the small Llama of ``tests/local_models.py`` (made once too)."""
    if args.model == "small-llama":
        return str(small_llama(args.cache_dir))
    if not args.pretrain_samples:
        return "tiny"
    return str(pretrained_model(args.pretrain_samples, 2 * args.micro_batch, args.seq_len, 3e-3, args.cache_dir))


def small_llama(cache_dir: Path) -> Path:
    """The small saved Llama of the tests (random weights, its own BPE tokenizer) and the corpus it reads."""
    sys.path.insert(0, str(HERE.parent / "tests"))
    from local_models import save_small_corpus, save_small_llama

    directory = cache_dir / "small-llama"
    if not (directory / "config.json").is_file():
        save_small_llama(directory)
    if not (cache_dir / "small-corpus.txt").is_file():
        save_small_corpus(cache_dir / "small-corpus.txt")
    return directory


def start_model(args):
    """The model every configuration starts from (see ``pretrained_start``), with LoRA adapters of
    rank ``--lora-r`` when given."""
    lora = {"r": args.lora_r, "alpha": 2 * args.lora_r, "dropout": 0.0} if args.lora_r else None
    return build_model(args.start, lora=lora, precision=args.precision, seed=SEED)


def run_baseline(config: Config, args, windows: list) -> tuple[float, list, float]:
    loaded = start_model(args)
    optimizer = torch.optim.AdamW(loaded.trainable(), lr=config.inner_lr)
    batch = config.batch_factor * args.micro_batch
    batches = train_batches(args.dataset, loaded.tokenizer, args.seq_len, batch, stream_seed(SEED, "baseline"), args.cache_dir)
    steps = args.total_samples // batch
    curve = []
    for step in range(steps):
        set_lr(optimizer, learning_rate(config, step, steps))
        causal_lm_loss(loaded.model, next(batches)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if (step + 1) % max(1, steps // 10) == 0:
            curve.append(((step + 1) * batch, mean_loss(loaded.model, windows[:4])))
    return mean_loss(loaded.model, windows), curve, 0.0


def through_8bit(tensor: torch.Tensor, compression: str) -> torch.Tensor:
    """What a peer receives for ``tensor`` after the all-reduce's compression."""
    if compression == "none":
        return tensor
    codec = Blockwise8Bit()
    return codec.extract(codec.compress(tensor, CompressionInfo.from_tensor(tensor)))


def sparse_round(outgoing: list[list[torch.Tensor]], rung) -> tuple[list[torch.Tensor], float]:
    """The average the reducers form of the replicas' sparse tensors, as their answers carry it
    back to the first replica, and the bytes all replicas sent in the round (see the module doc)."""
    replicas = len(outgoing)
    share = (replicas - 1) / replicas
    averaged, sent = [], 0.0
    for tensors in zip(*outgoing):
        mean = sum(tensors) / replicas
        answers = [encode_union(mean - tensor) for tensor in tensors]
        sent += share * sum(encode_top_k(tensor, rung).ByteSize() + answer.ByteSize() for tensor, answer in zip(tensors, answers))
        averaged.append(tensors[0] + decode(answers[0]))
    return averaged, sent


def run_diloco(config: Config, args, windows: list) -> tuple[float, list, float]:
    """DiLoCo's rounds; returns the eval loss, the curve and the bytes all replicas sent."""
    loaded = start_model(args)
    model, parameters = loaded.model, loaded.trainable()
    global_parameters = [parameter.detach().float().clone() for parameter in parameters]
    outer = torch.optim.SGD(global_parameters, lr=config.outer_lr, momentum=config.outer_momentum, nesterov=config.outer_momentum > 0)
    # one AdamW state and one data stream per replica; the model's weights are swapped in and out
    replicas = args.replicas
    states = [torch.optim.AdamW(parameters, lr=config.inner_lr).state_dict() for _ in range(replicas)]
    streams = [train_batches(args.dataset, loaded.tokenizer, args.seq_len, args.micro_batch, stream_seed(SEED, f"replica{index}"), args.cache_dir)
               for index in range(replicas)]
    steps = args.total_samples // (replicas * args.micro_batch)
    outer_steps = steps // config.local_steps
    rung = parse_rung(config.compression)
    feedback = [ErrorFeedback(rung, global_parameters, config.error_feedback_decay) for _ in range(replicas)]
    curve, sent = [], 0.0
    for outer_step in range(outer_steps):
        pseudo = [torch.zeros_like(tensor) for tensor in global_parameters]
        outgoing = []
        for replica in range(replicas):
            with torch.no_grad():
                for parameter, global_parameter in zip(parameters, global_parameters):
                    parameter.copy_(global_parameter)
            optimizer = torch.optim.AdamW(parameters, lr=config.inner_lr)
            optimizer.load_state_dict(states[replica])
            for inner in range(config.local_steps):
                set_lr(optimizer, learning_rate(config, outer_step * config.local_steps + inner, steps))
                causal_lm_loss(model, next(streams[replica])).backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            states[replica] = optimizer.state_dict()
            if rung.sparse:
                outgoing.append(feedback[replica].outgoing([g - p.detach().float() for g, p in zip(global_parameters, parameters)]))
                feedback[replica].sent()
                continue
            for total, global_parameter, parameter in zip(pseudo, global_parameters, parameters):
                total += through_8bit(global_parameter - parameter.detach().float(), config.compression) / replicas
        if rung.sparse:
            averaged_round, round_bytes = sparse_round(outgoing, rung)
        else:
            averaged_round = [through_8bit(averaged, config.compression) for averaged in pseudo]
            round_bytes = 2 * (replicas - 1) * sum(t.numel() for t in pseudo) * rung.send_bytes_per_value()
        sent += round_bytes
        for global_parameter, averaged in zip(global_parameters, averaged_round):
            global_parameter.grad = averaged
        outer.step()
        outer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for parameter, global_parameter in zip(parameters, global_parameters):
                parameter.copy_(global_parameter)
        curve.append(((outer_step + 1) * config.local_steps * replicas * args.micro_batch, mean_loss(model, windows[:4])))
    return mean_loss(model, windows), curve, sent


BASELINES = {"base-B": Config("base-B", "baseline", batch_factor=1),
             "base-4B": Config("base-4B", "baseline", batch_factor=4),
             "base-4B-cos": Config("base-4B-cos", "baseline", batch_factor=4, schedule="cosine")}
NAME_HELP = ("base-B, base-4B, base-4B-cos (each optionally -i<inner lr>), or H<local steps> followed by any of -o<outer lr> -m<outer momentum> "
             "-i<inner lr> -cos -none (no compression) -s<bits>b<k>of<chunk> (the rung sparse<bits>bit-<k>of<chunk>) "
             "-e<error feedback decay>, e.g. H256-o1.0-m0.5 or H40-o1-m0-s2b16of4096-e0.9; defaults: outer lr 0.7, "
             "momentum 0.9, inner lr 3e-3 constant, blockwise 8-bit, decay 1")


def parse_config(name: str) -> Config:
    """The configuration a ``--run`` name describes (see ``NAME_HELP``); ValueError if it describes none."""
    if name in BASELINES:
        return BASELINES[name]
    baseline = re.fullmatch(r"(base-B|base-4B|base-4B-cos)-i([\d.e-]+)", name)
    if baseline:
        return dataclasses.replace(BASELINES[baseline.group(1)], name=name, inner_lr=float(baseline.group(2)))
    match = re.fullmatch(r"H(\d+)((?:-o[\d.e-]+|-m[\d.]+|-i[\d.e-]+|-cos|-none|-s\d+b\d+of\d+|-e[\d.]+)*)", name)
    if not match or int(match.group(1)) < 1:
        raise ValueError(f"unknown configuration {name!r}: use {NAME_HELP}")
    config = Config(name, "diloco", local_steps=int(match.group(1)))
    for part in re.findall(r"-(o[\d.e-]+?|m[\d.]+|i[\d.e-]+?|cos|none|s\d+b\d+of\d+|e[\d.]+)(?=-[omicnse]|$)", match.group(2)):
        if part == "cos":
            config.schedule = "cosine"
        elif part == "none":
            config.compression = "none"
        elif part[0] == "s":
            config.compression = parse_rung("sparse{}bit-{}of{}".format(*re.findall(r"\d+", part))).name
        elif part[0] == "e":
            config.error_feedback_decay = float(part[1:])
        else:
            setattr(config, {"o": "outer_lr", "m": "outer_momentum", "i": "inner_lr"}[part[0]], float(part[1:]))
    return config



def reference_bytes_per_sample(parameters: int, micro_batch: int) -> float:
    """Bytes a sample of an fp32 all-reduce after every step of all replicas (B samples each)."""
    return 2 * (REPLICAS - 1) / REPLICAS * parameters * 4 / micro_batch


def report(paths: list[Path], out: Path, baseline_loss: float | None = None) -> str:
    """The study's markdown from JSONL run files; ``baseline_loss``: base-4B's eval loss when no
    run file has it (``convergence.py``'s 4B baseline is the same computation, so the same number)."""
    rows = [json.loads(line) for path in paths for line in path.read_text().splitlines() if line.strip()]
    parameters = build_model("tiny", seed=SEED).trainable_parameters
    by_budget: dict[tuple, list] = {}
    for row in rows:
        key = (row.get("pretrain_samples", 0), row["total_samples"], row["micro_batch"], row["seq_len"])
        by_budget.setdefault(key, []).append(row)
    lines = ["# DiLoCo study: what the simulation says", "",
             "Exact DiLoCo math with 4 replicas in one process (no swarm): `benchmarks/diloco_study.py` (see its "
             "docstring). Commands: each row's `--run NAME` with the budget flags of its section, then "
             "`.venv/bin/python benchmarks/diloco_study.py --report benchmarks/diloco_study_runs.jsonl`.", "",
             "Eval loss: mean cross-entropy (nats/byte) on 256 fixed validation windows. Δ is against `base-4B` "
             "(1 replica at batch 4B, same lr and schedule kind as its row's note says). Unless named, DiLoCo rows use "
             "inner AdamW lr 3e-3 constant, outer Nesterov SGD lr 0.7 momentum 0.9, blockwise 8-bit pseudo-gradients. "
             "Bytes/sample: what all replicas send ÷ samples trained (dense: the butterfly all-reduce's formula; sparse: "
             "the encoded parts and answers, see the docstring); the reduction is against an fp32 all-reduce after "
             f"every step ({reference_bytes_per_sample(parameters, 4):,.0f} bytes a sample at B = 4).", ""]
    for (pretrain_samples, total, micro_batch, seq_len), group in sorted(by_budget.items()):
        reference = {row["config"]["name"]: row["eval_loss"] for row in group}
        if baseline_loss is not None:
            reference.setdefault("base-4B", baseline_loss)
        start = (f"from the tiny preset pretrained on {pretrain_samples:,} samples" if pretrain_samples
                 else "from random weights")
        lines += [f"## {start}: {total:,} total samples, B = {micro_batch}, seq_len {seq_len} "
                  f"({total // (REPLICAS * micro_batch)} inner steps per replica)", "",
                  "| config | H | outer steps | inner lr | schedule | outer lr | momentum | compression | eval loss | "
                  "Δ vs base-4B | Δ vs base-4B-cos | bytes/sample | reduction |",
                  "|---|---:|---:|---:|---|---:|---:|---|---:|---:|---:|---:|---:|"]
        for row in sorted(group, key=lambda r: (r["config"]["kind"], r["config"]["local_steps"], r["config"]["name"])):
            config = row["config"]
            deltas = [f"{100 * (row['eval_loss'] - reference[key]) / reference[key]:+.2f} %" if key in reference else ""
                      for key in ("base-4B", "base-4B-cos")]
            outer_steps = total // (REPLICAS * micro_batch) // config["local_steps"] if config["kind"] == "diloco" else ""
            diloco = config["kind"] == "diloco"
            warmup = f" (warm-up {config['warmup_steps']})" if config["warmup_steps"] else ""
            compression, communication = "", " | "
            if diloco:
                compression = config["compression"] + (f", decay {config['error_feedback_decay']:g}"
                                                       if config.get("error_feedback_decay", 1) != 1 else "")
                sent = row.get("averaging_bytes")
                if sent is None:  # runs from before the study counted bytes: the dense all-reduce's formula
                    sent = outer_steps * REPLICAS * 2 * (REPLICAS - 1) / REPLICAS * parameters * parse_rung(config["compression"]).send_bytes_per_value()
                per_sample = sent / total
                communication = f"{per_sample:,.0f} | {reference_bytes_per_sample(parameters, micro_batch) / per_sample:,.0f}x"
            lines.append(f"| {config['name']} | {config['local_steps'] or ''} | {outer_steps} | {config['inner_lr']:g} | "
                         f"{config['schedule']}{warmup} | "
                         f"{config['outer_lr'] if diloco else ''} | {config['outer_momentum'] if diloco else ''} | "
                         f"{compression} | {row['eval_loss']:.4f} | {deltas[0]} | {deltas[1]} | {communication} |")
        lines.append("")
    text = "\n".join(lines) + "\n"
    out.write_text(text)
    return text


def sparse_table(paths: list[Path]) -> str:
    """RESULTS.md's simulated sparse table: every sparse DiLoCo row of ``paths`` (a configuration run
    again: its latest row), by reduction (largest first), its Δ against the base-4B row of the same
    budget; Δ and reduction in bold where both meet issue 15's goal (within 2 % at >= 10,000x)."""
    rows = [json.loads(line) for path in paths for line in path.read_text().splitlines() if line.strip()]

    def budget(row: dict) -> tuple:
        return row.get("pretrain_samples", 0), row["total_samples"], row["micro_batch"], row["seq_len"]

    baselines = {budget(row): row["eval_loss"] for row in rows if row["config"]["name"] == "base-4B"}
    latest = {(budget(row), row["config"]["name"]): row for row in rows
              if row["config"]["kind"] == "diloco" and parse_rung(row["config"]["compression"]).sparse}
    goal = next(factor for _, kind, _, factor in GOALS if kind == "sparse DiLoCo")
    parameters = build_model("tiny", seed=SEED).trainable_parameters
    lines = ["| simulated | eval loss | Δ vs base-4B | bytes/sample | reduction |", "|---|---:|---:|---:|---:|"]
    table = []
    for (key, _), row in latest.items():
        config = row["config"]
        if key not in baselines:
            raise ValueError(f"{config['name']}: no base-4B row of the same budget")
        delta = 100 * (row["eval_loss"] - baselines[key]) / baselines[key]
        per_sample = row["averaging_bytes"] / row["total_samples"]
        reduction = reference_bytes_per_sample(parameters, row["micro_batch"]) / per_sample
        table.append((reduction, config, row["eval_loss"], delta, per_sample))
    for reduction, config, loss, delta, per_sample in sorted(table, key=lambda entry: (-entry[0], entry[1]["name"])):
        bold = "**" if delta <= 2 and reduction >= goal else ""
        name = (f"H{config['local_steps']}, outer lr {config['outer_lr']:g}"
                + (f", momentum {config['outer_momentum']:g}" if config["outer_momentum"] else "")
                + (f", inner lr {config['inner_lr']:g}" if config["inner_lr"] != 3e-3 else "")
                + (f", {config['schedule']}" if config["schedule"] != "constant" else "")
                + f", {config['compression']}"
                + (f", decay {config['error_feedback_decay']:g}" if config["error_feedback_decay"] != 1 else ""))
        lines.append(f"| {bold}{name}{bold} | {loss:.4f} | {bold}{delta:+.2f} %{bold} | {per_sample:,.0f} | {bold}{reduction:,.0f}x{bold} |")
    return "\n".join(lines)


# the stability criteria of ``--stability`` (issue 24)
DIVERGED_RISE = 0.50  # an eval loss this far above the one before training: the run diverged
DEGRADED_RISE = 0.05  # ending this far above plain AdamW on the same samples: unstable enough to avoid


def stability(paths: list[Path]) -> str:
    """The stability table of ``benchmarks/RESULTS.md`` from JSONL run files: per model, peers and
    inner lr, each outer lr and momentum (rows) at each H (columns), the final eval loss against
    plain AdamW on the same samples (base-B for a lone peer, base-4B for four), or *diverged*."""
    rows = [json.loads(line) for path in paths for line in path.read_text().splitlines() if line.strip()]
    groups: dict[tuple, list] = {}
    for row in rows:
        key = (row.get("model", "tiny"), row.get("lora_r"), row.get("precision", "fp32"), row.get("pretrain_samples", 0),
               row.get("replicas", REPLICAS), row["config"]["inner_lr"], row["total_samples"], row["micro_batch"], row["seq_len"])
        groups.setdefault(key, []).append(row)
    lines = []
    for (model, lora_r, precision, pretrain, replicas, inner_lr, total, micro_batch, seq_len), group in sorted(groups.items(), key=str):
        baseline_name = "base-B" if replicas == 1 else "base-4B"
        # a configuration run again: its latest row counts
        baseline = next((row for row in reversed(group) if row["config"]["name"].startswith(baseline_name)
                         and row["config"]["batch_factor"] == (1 if replicas == 1 else 4)
                         and row["config"]["schedule"] == "constant"), None)
        diloco = [row for row in group if row["config"]["kind"] == "diloco"]
        if baseline is None or not diloco:
            continue
        what = (f"LoRA r {lora_r} over the small Llama ({precision})" if lora_r else
                f"the tiny preset pretrained on {pretrain:,} samples" if pretrain else "the tiny preset from random weights")
        peers = "a lone peer" if replicas == 1 else f"{replicas} peers"
        lines += [f"{what}, {peers}, inner lr {inner_lr:g}, {total:,} samples (B = {micro_batch}, seq_len {seq_len}); "
                  f"plain AdamW ({baseline_name}) ends at {baseline['eval_loss']:.4f}:", ""]
        local_steps = sorted({row["config"]["local_steps"] for row in diloco})
        lines += ["| outer lr | momentum | step ÷ progress | " + " | ".join(f"H = {h} ({h * micro_batch * replicas} samples)" for h in local_steps) + " |",
                  "|---:|---:|---:|" + "---:|" * len(local_steps)]
        settings = sorted({(row["config"]["outer_lr"], row["config"]["outer_momentum"]) for row in diloco},
                          key=lambda pair: (pair[0] / (1 - pair[1]), pair))
        for outer_lr, momentum in settings:
            cells = []
            for h in local_steps:
                found = [row for row in diloco if (row["config"]["outer_lr"], row["config"]["outer_momentum"], row["config"]["local_steps"]) == (outer_lr, momentum, h)]
                cells.append(stability_cell(found[-1], baseline["eval_loss"]) if found else "")
            lines.append(f"| {outer_lr:g} | {momentum:g} | {outer_lr / (1 - momentum):.1f} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def stability_cell(row: dict, baseline_loss: float) -> str:
    """``+1.2 %`` (final eval loss against plain AdamW), in bold past ``DEGRADED_RISE``, or diverged."""
    losses = [loss for _, loss in row["curve"]] + [row["eval_loss"]]
    start = row.get("start_loss")
    if row.get("non_finite") or any(not math.isfinite(loss) for loss in losses):
        return "**diverged** (non-finite)"
    if start is not None and max(losses) > (1 + DIVERGED_RISE) * start:
        return f"**diverged** ({max(losses):.2f} from {start:.2f})"
    delta = (row["eval_loss"] - baseline_loss) / baseline_loss
    text = f"{100 * delta:+.1f} %"
    return f"**{text}**" if delta > DEGRADED_RISE else text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", action="append", default=[], help=f"configuration to simulate (repeatable): {NAME_HELP}")
    parser.add_argument("--total-samples", type=int, default=8000)
    parser.add_argument("--micro-batch", type=int, default=4, help="B")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--cache-dir", type=Path, default=Path("/tmp/p2ptrain-study-cache"))
    parser.add_argument("--out", type=Path, default=HERE / "diloco_study_runs.jsonl")
    parser.add_argument("--pretrain-samples", type=int, default=0,
                        help="start every configuration from the tiny preset pretrained on this many samples, as "
                             "convergence.py does (0: random weights)")
    parser.add_argument("--replicas", type=int, default=REPLICAS, help="peers simulated (1: a peer alone)")
    parser.add_argument("--model", choices=["tiny", "small-llama"], default="tiny",
                        help="the tiny preset, or the small saved Llama of the tests (with --lora-r: LoRA over it)")
    parser.add_argument("--lora-r", type=int, help="train LoRA adapters of this rank instead of every weight")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--report", type=Path, nargs="*", help="write diloco_study_results.md from these JSONL files")
    parser.add_argument("--stability", type=Path, nargs="*", help="print the stability table of RESULTS.md from these JSONL files")
    parser.add_argument("--baseline-loss", type=float, help="base-4B's eval loss, for --report when no run file has it")
    args = parser.parse_args()
    if args.report:
        print(report(args.report, HERE / "diloco_study_results.md", args.baseline_loss))
        return
    if args.stability:
        print(stability(args.stability))
        return
    torch.set_num_threads(1)
    args.start = pretrained_start(args)
    args.dataset = {"kind": "files", "paths": [str(args.cache_dir / "small-corpus.txt")]} if args.model == "small-llama" else DATASET
    tokenizer = start_model(args).tokenizer
    windows = validation_batches(args.dataset, tokenizer, args.seq_len, EVAL_BATCH, args.cache_dir, EVAL_BATCHES)
    start_loss = mean_loss(start_model(args).model, windows)
    for name in args.run:
        config = parse_config(name)
        before = facts()
        started = time.monotonic()
        eval_loss, curve, sent = (run_baseline if config.kind == "baseline" else run_diloco)(config, args, windows)
        row = {"config": asdict(config), "total_samples": args.total_samples, "micro_batch": args.micro_batch,
               "seq_len": args.seq_len, "pretrain_samples": args.pretrain_samples, "eval_loss": eval_loss, "curve": curve,
               "seconds": time.monotonic() - started, "averaging_bytes": sent, "replicas": args.replicas,
               "model": args.model, "lora_r": args.lora_r, "precision": args.precision, "start_loss": start_loss,
               "non_finite": not all(math.isfinite(loss) for _, loss in curve) or not math.isfinite(eval_loss),
               **before, "load_after": facts()["load"]}
        with args.out.open("a") as file:
            file.write(json.dumps(row) + "\n")
        print(f"{name}: eval loss {eval_loss:.4f} ({row['seconds']:.0f} s)", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
