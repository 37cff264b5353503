"""Averaging in groups: DiLoCo's exact math when each outer step averages within groups, not the whole swarm.

    nice -n 10 .venv/bin/python benchmarks/group_study.py --replicas 16 --group-size 4 --pretrain-samples 24000 \
        --total-samples 25600 --local-steps 20 --run one-pseudo --run moshpit-pseudo --run moshpit-local [--out FILE.jsonl]
    .venv/bin/python benchmarks/group_study.py --report FILE.jsonl [FILE.jsonl ...]

Issue 25: at a thousand peers, one averaging group of all of them waits for the slowest and costs the group
key's holders N / 4 declarations a fetch. Groups of G (hivemind's ``target_group_size``) fix both, but then each
peer's outer step differs from its neighbours', and their models may drift apart. This simulates N replicas of
the `tiny` model in one process (as ``diloco_study.py``: inner AdamW per replica kept across outer steps, its own
data stream, Nesterov SGD outer step), each with its *own* global parameters and outer momentum, and a
configuration ``<grouping>-<payload>``:

- grouping ``one``: one group of all N (today's runs); ``fixed``: the same groups every round; ``moshpit``:
  hivemind's ``GroupKeyManager`` rule (Moshpit SGD): a peer's group key is log2(N / G) bits; after a round each
  member of a group takes a distinct random bucket of G and shifts its bits in, so a group's members go to
  different groups next round; ``random``: a new random partition every round.
- payload ``pseudo``: the group averages its members' pseudo-gradients (``global - local``), each member takes
  its outer step from its own global parameters (what ``PseudoGradientAverager`` averages today);
  ``local``: the group averages its members' local parameters (after the inner steps) and each member's
  pseudo-gradient is its own global parameters less that average: the group's mean update plus the pull
  towards the group's consensus (with outer lr 1 and no momentum, a member's new global parameters are the
  group's mean: Moshpit's parameter averaging); ``mixed<K>``: the pseudo-gradients every round, and every K-th
  round the group's global parameters too (each member takes the group's mean before its outer step): the
  consensus at a K-th of ``local``'s parameter traffic.

Every payload is averaged exactly (no compression: the study is about mixing). Each outer step records the
eval loss of the replicas' mean model and the spread (the largest ``|theta_i - mean| / |mean|``); the end,
every replica's eval loss; ``reach``: per round, how many rounds until every peer's update of that round has
reached every other (through the groups' averages). ``--seed`` changes the replicas' data streams and the
groupings' random choices (not the model). ``--parameter-groups own``: a ``mixed`` payload's parameters are
averaged after the outer step in groups drawn apart from the pseudo-gradients' (as a second averager with its own
matchmaking would form them), not before it in the same groups.

Two stresses the product meets: ``--churn P``: each round each replica is away with probability P (it trains
nothing and averages nothing); one that comes back downloads a random present replica's global parameters and
outer momentum, as a joiner downloads a donor's state. ``--rogues R``: replicas 0..R-1 send, in every average,
their own piece pushed ``ROGUE_SCALE`` times their round's update the wrong way (a pseudo-gradient flipped and
scaled; parameters moved back along it), and groups combine with the product's reducer (CenteredClip,
``peers/robust/reduce.robust_aggregate``) instead of the mean; the losses and spread are then the honest
replicas'. ``--codec-error`` appends a row of what sending the start model's
parameters themselves would lose: each compression's error relative to their norm. Rows append to ``--out``;
``--report`` prints the table of ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import sys
import time
from pathlib import Path

import torch
from hivemind.compression import CompressionInfo

from p2ptrain.peers.compression.codecs import make_compression
from p2ptrain.peers.model.data import train_batches, validation_batches
from p2ptrain.peers.model.models import causal_lm_loss, mean_loss
from p2ptrain.peers.robust.reduce import RobustOptions, robust_aggregate
from p2ptrain.peers.worker.run_setup import stream_seed

from diloco_study import DATASET, EVAL_BATCH, EVAL_BATCHES, SEED, pretrained_start, set_lr, start_model  # beside this script
from run_facts import facts  # benchmarks/run_facts.py

HERE = Path(__file__).resolve().parent
GROUPINGS = ("one", "fixed", "moshpit", "random")
PAYLOADS = ("pseudo", "local", "mixed<K>")
ROGUE_SCALE = 10.0


def parse_run(name: str) -> tuple[str, str, int]:
    """``(grouping, payload, K)`` of a ``--run`` name such as ``moshpit-local`` or ``moshpit-mixed4`` (K: the rounds
    between parameter averages, 0 for none); ValueError otherwise."""
    grouping, _, payload = name.partition("-")
    mixed = re.fullmatch(r"mixed([1-9]\d*)", payload)
    if grouping not in GROUPINGS or not (payload in PAYLOADS or mixed):
        raise ValueError(f"unknown configuration {name!r}: use <grouping>-<payload>, grouping one of {', '.join(GROUPINGS)}, "
                         f"payload one of {', '.join(PAYLOADS)}")
    return grouping, ("mixed" if mixed else payload), (int(mixed.group(1)) if mixed else 0)


class Groups:
    """Who averages with whom, round after round, for ``replicas`` peers in groups of ``group_size``.

    Args:
        grouping: one of ``GROUPINGS`` (see the module doc).
        seed: the random choices' seed (moshpit's buckets, random's partitions).
    """

    def __init__(self, grouping: str, replicas: int, group_size: int, seed: int = SEED):
        if grouping != "one" and (replicas % group_size or group_size < 2):
            raise ValueError(f"--replicas {replicas} is not a multiple of --group-size {group_size} (>= 2)")
        self.grouping, self.replicas, self.group_size = grouping, replicas, group_size
        self.random = random.Random(seed)
        buckets = replicas // group_size
        self.bits = max(0, math.ceil(math.log2(buckets))) if grouping == "moshpit" else 0
        # moshpit: each peer starts in a random group key, as hivemind's initial_group_bits drawn at random
        self.keys = [self.random.randrange(2 ** self.bits) if self.bits else 0 for _ in range(replicas)]

    def next_round(self) -> list[list[int]]:
        """The groups of the next round (lists of replica indices)."""
        everyone = list(range(self.replicas))
        if self.grouping == "one":
            return [everyone]
        if self.grouping == "fixed":
            return [everyone[start:start + self.group_size] for start in range(0, self.replicas, self.group_size)]
        if self.grouping == "random":
            self.random.shuffle(everyone)
            return [sorted(everyone[start:start + self.group_size]) for start in range(0, self.replicas, self.group_size)]
        return self._moshpit_round()

    def _moshpit_round(self) -> list[list[int]]:
        # peers under one key form groups of at most G (hivemind's matchmaking splits a crowded key)
        by_key: dict[int, list[int]] = {}
        for replica, key in enumerate(self.keys):
            by_key.setdefault(key, []).append(replica)
        groups = []
        for members in by_key.values():
            self.random.shuffle(members)
            groups += [sorted(members[start:start + self.group_size]) for start in range(0, len(members), self.group_size)]
        # GroupKeyManager.update_key_on_group_assembled: distinct buckets of G within a group, shifted into the key
        shift = math.ceil(math.log2(self.group_size))
        for group in groups:
            for member, bucket in zip(group, self.random.sample(range(self.group_size), len(group))):
                self.keys[member] = ((self.keys[member] << shift) | bucket) % (2 ** self.bits) if self.bits else 0
        return groups


def rounds_to_reach_everyone(rounds: list[list[list[int]]], replicas: int) -> list[int | None]:
    """For each round, how many rounds (counting it) until every replica's update of that round has reached
    every replica through the groups' averages; None when the recorded rounds end first."""
    reached = []
    for start in range(len(rounds)):
        knows = [{replica} for replica in range(replicas)]  # knows[i]: whose update of round `start` reached i
        answer = None
        for offset, groups in enumerate(rounds[start:], 1):
            for group in groups:
                merged = set().union(*(knows[member] for member in group))
                for member in group:
                    knows[member] = merged
            if all(len(known) == replicas for known in knows):
                answer = offset
                break
        reached.append(answer)
    return reached


def spread(global_parameters: list[list[torch.Tensor]]) -> float:
    """The largest ``|theta_i - mean| / |mean|`` over the replicas (all tensors together)."""
    mean = [sum(tensors) / len(tensors) for tensors in zip(*global_parameters)]
    mean_norm = math.sqrt(sum(float(tensor.pow(2).sum()) for tensor in mean))
    return max(math.sqrt(sum(float((own - average).pow(2).sum()) for own, average in zip(replica, mean))) / mean_norm
               for replica in global_parameters)


def load(parameters, tensors) -> None:
    with torch.no_grad():
        for parameter, tensor in zip(parameters, tensors):
            parameter.copy_(tensor)


def combine(pieces: dict[int, list[torch.Tensor]], robust: bool) -> list[torch.Tensor]:
    """A group's average of its members' ``pieces`` (by member, a tensor per parameter): the mean, or
    with ``robust`` the product's reducer, tensor by tensor, every member at weight 1."""
    members = sorted(pieces)
    if not robust:
        return [sum(pieces[member][index] for member in members) / len(members) for index in range(len(pieces[members[0]]))]
    return [robust_aggregate({member: pieces[member][index] for member in members}, dict.fromkeys(members, 1.0), own=None,
                             options=RobustOptions(name_outliers=False, detect_replays=False)).result
            for index in range(len(pieces[members[0]]))]


def sent_by(member: int, honest: list[torch.Tensor], update: list[torch.Tensor], rogues: int, parameters: bool) -> list[torch.Tensor]:
    """What ``member`` sends for its ``honest`` piece: a rogue's (member < ``rogues``) pushed ``ROGUE_SCALE`` times
    its round's ``update`` (global less local) the wrong way: a pseudo-gradient flipped and scaled, parameters
    moved back along it (``parameters``)."""
    if member >= rogues:
        return honest
    if parameters:
        return [piece + ROGUE_SCALE * step for piece, step in zip(honest, update)]
    return [-ROGUE_SCALE * piece for piece in honest]


def download_state(global_parameters: list, outers: list, joiner: int, donor: int) -> None:
    """``joiner`` takes ``donor``'s global parameters and outer momentum (a state download)."""
    load(global_parameters[joiner], global_parameters[donor])
    for own, theirs in zip(global_parameters[joiner], global_parameters[donor]):
        buffer = outers[donor].state.get(theirs, {}).get("momentum_buffer")
        if buffer is not None:
            outers[joiner].state[own]["momentum_buffer"] = buffer.clone()


def average_parameters(global_parameters: list, groups: list[list[int]], away: set[int], rogues: int, robust: bool) -> None:
    """Each of ``groups`` (but the replicas ``away``) takes its members' average of their global parameters (a
    rogue's moved back along its last step: its parameters against the mean's, ``ROGUE_SCALE`` times)."""
    for group in ([member for member in group if member not in away] for group in groups):
        if not group:
            continue
        mean = combine({member: global_parameters[member] for member in group}, robust=False)
        sent = {member: sent_by(member, global_parameters[member], [own - average for own, average in zip(global_parameters[member], mean)],
                                rogues, True) for member in group}
        consensus = combine(sent, robust)
        for member in group:
            load(global_parameters[member], consensus)


def run_groups(grouping: str, payload: str, every: int, args, windows: list) -> dict:  # noqa: C901 (one loop, as diloco_study's)
    """One configuration's run (``every``: a ``mixed`` payload's K); returns its row's measurements."""
    loaded = start_model(args)
    model, parameters = loaded.model, loaded.trainable()
    replicas = args.replicas
    start = [parameter.detach().float().clone() for parameter in parameters]
    global_parameters = [[tensor.clone() for tensor in start] for _ in range(replicas)]
    outers = [torch.optim.SGD(own, lr=args.outer_lr, momentum=args.outer_momentum, nesterov=args.outer_momentum > 0)
              for own in global_parameters]
    states = [torch.optim.AdamW(parameters, lr=args.inner_lr).state_dict() for _ in range(replicas)]
    streams = [train_batches(args.dataset, loaded.tokenizer, args.seq_len, args.micro_batch, stream_seed(args.seed, f"replica{index}"), args.cache_dir)
               for index in range(replicas)]
    outer_steps = args.total_samples // (replicas * args.micro_batch) // args.local_steps
    groups = Groups(grouping, replicas, args.group_size, args.seed)
    rounds, curve = [], []
    churn, robust, honest = random.Random(args.seed + 1), args.rogues > 0, list(range(args.rogues, replicas))
    parameter_groups = Groups(grouping, replicas, args.group_size, args.seed + 2) if args.parameter_groups == "own" else None
    away = set()
    for outer_step in range(outer_steps):
        was_away, away = away, {replica for replica in range(replicas) if args.churn and churn.random() < args.churn}
        stayed = [replica for replica in range(replicas) if replica not in away and replica not in was_away]
        for replica in sorted(was_away - away):
            download_state(global_parameters, outers, replica, churn.choice(stayed or honest))
        local_parameters = {}
        for replica in range(replicas):
            if replica in away:
                continue
            load(parameters, global_parameters[replica])
            optimizer = torch.optim.AdamW(parameters, lr=args.inner_lr)
            optimizer.load_state_dict(states[replica])
            set_lr(optimizer, args.inner_lr)
            for _ in range(args.local_steps):
                causal_lm_loss(model, next(streams[replica])).backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            states[replica] = optimizer.state_dict()
            local_parameters[replica] = [parameter.detach().float().clone() for parameter in parameters]
        this_round = [[member for member in group if member not in away] for group in groups.next_round()]
        this_round = [group for group in this_round if group]
        rounds.append(this_round)
        for group in this_round:
            update = {member: [own - local for own, local in zip(global_parameters[member], local_parameters[member])] for member in group}
            if payload == "mixed" and (outer_step + 1) % every == 0 and not parameter_groups:
                consensus = combine({member: sent_by(member, global_parameters[member], update[member], args.rogues, True)
                                     for member in group}, robust)
                for member in group:
                    load(global_parameters[member], consensus)
                update = {member: [own - local for own, local in zip(global_parameters[member], local_parameters[member])] for member in group}
            if payload in ("pseudo", "mixed"):
                mean_update = combine({member: sent_by(member, update[member], update[member], args.rogues, False) for member in group}, robust)
                pseudo = {member: mean_update for member in group}
            else:
                mean_local = combine({member: sent_by(member, local_parameters[member], update[member], args.rogues, True)
                                      for member in group}, robust)
                pseudo = {member: [own - average for own, average in zip(global_parameters[member], mean_local)] for member in group}
            for member in group:
                for tensor, gradient in zip(global_parameters[member], pseudo[member]):
                    tensor.grad = gradient.clone()
                outers[member].step()
                outers[member].zero_grad(set_to_none=True)
        if payload == "mixed" and (outer_step + 1) % every == 0 and parameter_groups:
            average_parameters(global_parameters, parameter_groups.next_round(), away, args.rogues, robust)
        honest_parameters = [global_parameters[replica] for replica in honest]
        load(parameters, [sum(tensors) / len(honest) for tensors in zip(*honest_parameters)])
        curve.append({"samples": (outer_step + 1) * args.local_steps * replicas * args.micro_batch,
                      "mean_model_loss": mean_loss(model, windows[:4]), "spread": spread(honest_parameters), "away": len(away)})
        print(f"{grouping}-{payload}{every or ''} round {outer_step + 1}/{outer_steps}: {curve[-1]}", file=sys.stderr, flush=True)
    load(parameters, [sum(tensors) / len(honest) for tensors in zip(*(global_parameters[replica] for replica in honest))])
    mean_model_loss = mean_loss(model, windows)
    replica_losses = []
    for own in (global_parameters[replica] for replica in honest):
        load(parameters, own)
        replica_losses.append(mean_loss(model, windows))
    return {"mean_model_loss": mean_model_loss, "replica_losses": replica_losses, "curve": curve,
            "reach": rounds_to_reach_everyone(rounds, replicas), "outer_steps": outer_steps}


def codec_error(args) -> dict:
    """``{compression: |decoded - parameters| / |parameters|}`` for the start model's trainable parameters."""
    parameters = [parameter.detach().float() for parameter in start_model(args).trainable()]
    errors = {}
    for name in ("fp16", "blockwise8bit"):
        codec = make_compression(name, parameters)
        decoded = [codec.extract(codec.compress(tensor, CompressionInfo.from_tensor(tensor))).float() for tensor in parameters]
        errors[name] = math.sqrt(sum(float((after - before).pow(2).sum()) for after, before in zip(decoded, parameters))
                                 / sum(float(tensor.pow(2).sum()) for tensor in parameters))
    return errors


def report(paths: list[Path]) -> str:
    """RESULTS.md's table: a row per configuration and budget, over its seeds (each seed's latest run), its Δ
    against ``one-pseudo`` of the same budget and seed. Spread: the mean over the last half of the rounds (a
    ``mixed`` payload's spread falls at each parameter average and grows until the next), and the largest."""
    rows = [json.loads(line) for path in paths for line in path.read_text().splitlines() if line.strip()]
    errors = [row for row in rows if row.get("kind") == "codec-error"]
    rows = [row for row in rows if row.get("kind") != "codec-error"]
    latest: dict[tuple, dict] = {}
    for row in rows:
        budget = (row["replicas"], row["group_size"], row["local_steps"], row["outer_lr"], row["outer_momentum"], row["total_samples"],
                  row.get("churn", 0.0), row.get("rogues", 0))
        run = row["run"] + (" (parameters in own groups)" if row.get("parameter_groups", "same") == "own" else "")
        latest[(budget, run, row.get("seed", SEED))] = row
    lines = []
    for budget in sorted({budget for budget, *_ in latest}):
        replicas, group_size, local_steps, outer_lr, momentum, total, churn, rogues = budget
        runs = sorted({run for key_budget, run, _ in latest if key_budget == budget}, key=lambda run: (run != "one-pseudo", run))
        stresses = (f", each away a round at {100 * churn:.0f} %" if churn else "") + (
            f", {rogues} rogue{'s' if rogues > 1 else ''} (CenteredClip; honest replicas' losses)" if rogues else "")
        lines += [f"{replicas} replicas, groups of {group_size}, H = {local_steps}, outer lr {outer_lr:g}, momentum {momentum:g}, "
                  f"{total:,} samples{stresses}:", "",
                  "| configuration | seeds | mean model's loss | Δ vs one group | worst replica's loss | spread, last half (largest) | "
                  "rounds to reach everyone (median, most) | commit, date, load |", "|---|---:|---:|---:|---:|---:|---:|---|"]
        for run in runs:
            found = [row for (key_budget, key_run, _), row in sorted(latest.items(), key=lambda item: item[0][2])
                     if key_budget == budget and key_run == run]
            deltas = []
            for row in found if run != "one-pseudo" else []:
                reference = latest.get((budget, "one-pseudo", row.get("seed", SEED)))
                if reference:
                    deltas.append((row["mean_model_loss"] - reference["mean_model_loss"]) / reference["mean_model_loss"])
            losses = [row["mean_model_loss"] for row in found]
            spreads = [point["spread"] for row in found for point in row["curve"][len(row["curve"]) // 2:]]
            reach = sorted(value for row in found for value in row["reach"] if value is not None)
            reach_text = f"{reach[len(reach) // 2]}, {reach[-1]}" if reach else "never"
            delta_text = (f"{100 * sum(deltas) / len(deltas):+.2f} %" + (f" ({100 * min(deltas):+.2f} to {100 * max(deltas):+.2f})"
                                                                           if len(deltas) > 1 else "")) if deltas else ""
            where = "; ".join(sorted({f"{row['commit'][:7]}{'-dirty' if row['commit'].endswith('-dirty') else ''}, {row['date'][:10]}, {row['load'][0]:.1f}" for row in found}))
            lines.append(f"| {run} | {len(found)} | {sum(losses) / len(losses):.4f} | {delta_text} | "
                         f"{max(max(row['replica_losses']) for row in found):.4f} | {sum(spreads) / len(spreads):.2g} "
                         f"({max(point['spread'] for row in found for point in row['curve']):.2g}) | {reach_text} | {where} |")
        lines.append("")
    for row in errors[-1:]:
        lines.append("The start model's parameters sent as they are would lose " + ", ".join(
            f"{100 * error:.2g} % of their norm in {name}" for name, error in row["errors"].items())
            + f" ({row['commit'][:7]}{'-dirty' if row['commit'].endswith('-dirty') else ''}, {row['date'][:10]}).")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", action="append", default=[], help="<grouping>-<payload> (repeatable), e.g. moshpit-local")
    parser.add_argument("--replicas", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--local-steps", type=int, default=20, help="H")
    parser.add_argument("--inner-lr", type=float, default=3e-3)
    parser.add_argument("--outer-lr", type=float, default=1.0, help="default: the product's (outer_step.DEFAULT_OUTER_LR)")
    parser.add_argument("--outer-momentum", type=float, default=0.0)
    parser.add_argument("--total-samples", type=int, default=25600)
    parser.add_argument("--seed", type=int, default=SEED, help="the data streams' and groupings' seed")
    parser.add_argument("--churn", type=float, default=0.0, help="the chance that a replica is away in a round (0 to < 1)")
    parser.add_argument("--rogues", type=int, default=0, help="how many replicas send rogue pieces (groups then combine robustly)")
    parser.add_argument("--parameter-groups", choices=("same", "own"), default="same",
                        help="a mixed payload's parameters: in the round's groups, before its outer step (same), or after it "
                             "in groups of their own (own: a second averager's matchmaking, drawn as the grouping draws)")
    parser.add_argument("--micro-batch", type=int, default=4, help="B")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--pretrain-samples", type=int, default=24000, help="start from the tiny preset pretrained on this many samples")
    parser.add_argument("--cache-dir", type=Path, default=Path("/tmp/p2ptrain-study-cache"))
    parser.add_argument("--out", type=Path, default=HERE / "group_study_runs.jsonl")
    parser.add_argument("--codec-error", action="store_true", help="append a row of each compression's error on the start model's parameters")
    parser.add_argument("--report", type=Path, nargs="*", help="print the table of RESULTS.md from these JSONL files")
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
        return
    if not 0 <= args.churn < 1 or not 0 <= args.rogues < args.replicas:
        parser.error("use --churn from 0 up to (not including) 1, and --rogues from 0 to fewer than --replicas")
    try:
        runs = [parse_run(name) for name in args.run]
        for grouping, *_ in runs:
            Groups(grouping, args.replicas, args.group_size)
    except ValueError as error:
        parser.error(str(error))
    torch.set_num_threads(1)
    args.model, args.lora_r, args.precision, args.dataset = "tiny", None, "fp32", DATASET
    args.start = pretrained_start(args)
    if args.codec_error:
        with args.out.open("a") as file:
            file.write(json.dumps({"kind": "codec-error", "errors": codec_error(args), "pretrain_samples": args.pretrain_samples, **facts()}) + "\n")
    windows = validation_batches(args.dataset, start_model(args).tokenizer, args.seq_len, EVAL_BATCH, args.cache_dir, EVAL_BATCHES)
    for name, (grouping, payload, every) in zip(args.run, runs):
        before = facts()
        started = time.monotonic()
        measured = run_groups(grouping, payload, every, args, windows)
        row = {"run": name, "replicas": args.replicas, "group_size": args.group_size, "local_steps": args.local_steps,
               "inner_lr": args.inner_lr, "outer_lr": args.outer_lr, "outer_momentum": args.outer_momentum,
               "total_samples": args.total_samples, "micro_batch": args.micro_batch, "seq_len": args.seq_len,
               "pretrain_samples": args.pretrain_samples, "seed": args.seed, "churn": args.churn, "rogues": args.rogues,
               "parameter_groups": args.parameter_groups, **measured, "seconds": time.monotonic() - started,
               **before, "load_after": facts()["load"]}
        with args.out.open("a") as file:
            file.write(json.dumps(row) + "\n")
        print(f"{name}: mean model {measured['mean_model_loss']:.4f}, worst replica {max(measured['replica_losses']):.4f} "
              f"({row['seconds']:.0f} s)", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
