"""The averaging-in-groups simulation (``benchmarks/group_study.py``): who averages with whom, how fast an
update reaches everyone, and what each payload does to the replicas' parameters."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import group_study  # noqa: E402


@pytest.mark.parametrize("grouping", ["fixed", "moshpit", "random"])
def test_every_round_puts_each_replica_in_one_group_of_at_most_the_group_size(grouping):
    groups = group_study.Groups(grouping, replicas=16, group_size=4, seed=3)
    for _ in range(12):
        this_round = groups.next_round()
        members = sorted(member for group in this_round for member in group)
        assert members == list(range(16))
        assert all(1 <= len(group) <= 4 for group in this_round)


def test_moshpit_sends_a_full_groups_members_to_different_groups_and_then_mixes_everyone_in_two_rounds():
    """hivemind's rule: the members of a group of G take distinct buckets, so with 4 keys of 4 a full group's
    members are spread over all 4 keys; once the groups are full, 2 rounds (log_4 16) reach everyone."""
    groups = group_study.Groups("moshpit", replicas=16, group_size=4, seed=1)
    rounds = [groups.next_round() for _ in range(30)]
    for this_round, after in zip(rounds, rounds[1:]):
        for group in (group for group in this_round if len(group) == 4):
            next_groups = {next(index for index, other in enumerate(after) if member in other) for member in group}
            assert len(next_groups) == 4, (group, after)
    reach = group_study.rounds_to_reach_everyone(rounds, 16)
    assert reach[-1] is None or reach[-1] >= 2
    settled = [value for value in reach[10:] if value is not None]
    assert settled and set(settled) == {2}, reach


def test_reach_counts_rounds_until_every_update_is_everywhere_and_never_for_fixed_groups():
    pairs = [[0, 1], [2, 3]]
    crossed = [[0, 2], [1, 3]]
    assert group_study.rounds_to_reach_everyone([pairs, crossed, pairs], 4) == [2, 2, None]
    fixed = group_study.Groups("fixed", replicas=8, group_size=4)
    assert group_study.rounds_to_reach_everyone([fixed.next_round() for _ in range(5)], 8) == [None] * 5
    assert group_study.rounds_to_reach_everyone([[[0, 1, 2]]], 3) == [1]


def test_bad_configurations_are_refused_with_what_to_use():
    assert group_study.parse_run("moshpit-mixed4") == ("moshpit", "mixed", 4)
    assert group_study.parse_run("one-pseudo") == ("one", "pseudo", 0)
    for bad in ("moshpit", "moshpit-mixed0", "ring-local", "fixed-params"):
        with pytest.raises(ValueError, match="use <grouping>-<payload>"):
            group_study.parse_run(bad)
    with pytest.raises(ValueError, match="not a multiple of --group-size"):
        group_study.Groups("moshpit", replicas=10, group_size=4)


def tiny_args(tmp_path: Path, **overrides) -> argparse.Namespace:
    args = argparse.Namespace(replicas=4, group_size=2, local_steps=2, inner_lr=3e-3, outer_lr=1.0, outer_momentum=0.0,
                              total_samples=48, micro_batch=2, seq_len=16, pretrain_samples=0, seed=1, cache_dir=tmp_path,
                              model="tiny", lora_r=None, precision="fp32", dataset=group_study.DATASET, start="tiny",
                              churn=0.0, rogues=0, parameter_groups="same")
    for name, value in overrides.items():
        setattr(args, name, value)
    return args


@pytest.mark.timeout(120)
def test_local_parameters_averaged_at_outer_lr_1_leave_a_group_on_one_model_and_pseudo_gradients_do_not(tmp_path):
    """With outer lr 1 and no momentum, ``local`` sets every member to its group's mean: one group of everyone
    stays on one model, fixed groups of 2 on two. In fixed groups the members' global parameters never differ,
    so there the pseudo-gradients' average lands where the local parameters' average does: the same spreads."""
    from p2ptrain.peers.model.data import validation_batches
    from p2ptrain.peers.model.models import build_model

    args = tiny_args(tmp_path)
    tokenizer = build_model("tiny", seed=group_study.SEED).tokenizer
    windows = validation_batches(args.dataset, tokenizer, args.seq_len, 2, tmp_path, 2)
    one = group_study.run_groups("one", "local", 0, args, windows)
    assert one["outer_steps"] == 3 and all(point["spread"] < 1e-6 for point in one["curve"])
    assert max(one["replica_losses"]) - min(one["replica_losses"]) < 1e-5
    fixed = group_study.run_groups("fixed", "local", 0, args, windows)
    assert all(point["spread"] > 1e-4 for point in fixed["curve"])
    assert fixed["reach"] == [None] * 3
    pseudo = group_study.run_groups("fixed", "pseudo", 0, args, windows)
    assert [round(point["spread"], 5) for point in pseudo["curve"]] == [round(point["spread"], 5) for point in fixed["curve"]]


def test_a_groups_robust_average_holds_a_rogue_near_the_honest_mean_and_the_plain_mean_does_not():
    import torch

    generator = torch.Generator().manual_seed(0)
    honest = {member: [torch.ones(64) + 0.1 * torch.randn(64, generator=generator)] for member in (1, 2, 3)}
    update = [0.1 * torch.ones(64)]
    rogue = group_study.sent_by(0, [torch.ones(64)], update, rogues=1, parameters=False)
    assert torch.allclose(rogue[0], -group_study.ROGUE_SCALE * torch.ones(64))
    assert group_study.sent_by(1, honest[1], update, rogues=1, parameters=False) is honest[1]
    pieces = {0: rogue, **honest}
    honest_mean = sum(piece[0] for piece in honest.values()) / 3
    plain = group_study.combine(pieces, robust=False)[0]
    robust = group_study.combine(pieces, robust=True)[0]
    assert (plain - honest_mean).norm() > 5 * (robust - honest_mean).norm()
    # without a rogue the robust average is the mean (nothing is clipped)
    assert torch.allclose(group_study.combine(honest, robust=True)[0], honest_mean, atol=1e-5)
    moved = group_study.sent_by(0, [torch.ones(64)], update, rogues=1, parameters=True)
    assert torch.allclose(moved[0], torch.ones(64) + group_study.ROGUE_SCALE * update[0]), "parameters moved back along the update"


def test_a_returning_replica_downloads_a_donors_parameters_and_outer_momentum():
    import torch

    parameters = [[torch.zeros(3)], [torch.ones(3)]]
    outers = [torch.optim.SGD(own, lr=1.0, momentum=0.9, nesterov=True) for own in parameters]
    parameters[1][0].grad = torch.ones(3)
    outers[1].step()
    group_study.download_state(parameters, outers, joiner=0, donor=1)
    assert torch.equal(parameters[0][0], parameters[1][0])
    assert torch.equal(outers[0].state[parameters[0][0]]["momentum_buffer"], outers[1].state[parameters[1][0]]["momentum_buffer"])
    assert outers[0].state[parameters[0][0]]["momentum_buffer"] is not outers[1].state[parameters[1][0]]["momentum_buffer"]


def test_parameters_averaged_in_their_own_groups_leave_each_group_on_its_mean_and_the_away_untouched():
    import torch

    parameters = [[torch.full((3,), float(replica))] for replica in range(6)]
    group_study.average_parameters(parameters, [[0, 1, 2], [3, 4, 5]], away={5}, rogues=0, robust=False)
    assert [float(own[0][0]) for own in parameters] == [1.0, 1.0, 1.0, 3.5, 3.5, 5.0]


@pytest.mark.timeout(120)
def test_churn_leaves_replicas_out_of_rounds_and_a_rogues_losses_are_not_counted(tmp_path):
    from p2ptrain.peers.model.data import validation_batches
    from p2ptrain.peers.model.models import build_model

    args = tiny_args(tmp_path, total_samples=96, churn=0.5, rogues=1, parameter_groups="own")
    tokenizer = build_model("tiny", seed=group_study.SEED).tokenizer
    windows = validation_batches(args.dataset, tokenizer, args.seq_len, 2, tmp_path, 2)
    row = group_study.run_groups("random", "mixed", 2, args, windows)
    assert row["outer_steps"] == 6 and any(point["away"] for point in row["curve"])
    assert len(row["replica_losses"]) == args.replicas - args.rogues
    assert all(loss == loss and loss < 20 for loss in row["replica_losses"])


def study_row(run: str, seed: int, loss: float, spreads: list[float], reach: list, worst: float | None = None) -> dict:
    return {"run": run, "seed": seed, "replicas": 16, "group_size": 4, "local_steps": 20, "outer_lr": 1.0, "outer_momentum": 0.0,
            "total_samples": 25600, "mean_model_loss": loss, "replica_losses": [loss, worst or loss],
            "curve": [{"samples": index, "mean_model_loss": loss, "spread": spread} for index, spread in enumerate(spreads)],
            "reach": reach, "commit": "0123456789abcdef-dirty", "date": "2026-11-29T10:00:00+00:00", "load": [1.5, 1.0, 1.0]}


def test_the_report_averages_each_configuration_over_its_seeds_against_one_group_of_the_same_seed(tmp_path):
    path = tmp_path / "runs.jsonl"
    rows = [study_row("one-pseudo", 1, 2.0, [0, 0, 0, 0], [1, 1, 1, 1]),
            study_row("one-pseudo", 2, 1.0, [0, 0, 0, 0], [1, 1, 1, 1]),
            study_row("moshpit-local", 1, 2.02, [0.3, 0.1, 0.02, 0.04], [5, 2, 2, None], worst=2.1),
            study_row("moshpit-local", 2, 1.03, [0.2, 0.1, 0.04, 0.02], [3, 2, 2, None]),
            {"kind": "codec-error", "errors": {"fp16": 0.0002, "blockwise8bit": 0.015}, "commit": "fedcba9876543210",
             "date": "2026-11-29T11:00:00+00:00"}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    table = group_study.report([path])
    local = next(line for line in table.splitlines() if line.startswith("| moshpit-local"))
    # Δ: +1 % and +3 % against each seed's own one group; worst replica over both seeds; spread: the last half's mean
    assert local.startswith("| moshpit-local | 2 | 1.5250 | +2.00 % (+1.00 to +3.00) | 2.1000 | 0.03 (0.3) | 2, 5 | 0123456-dirty"), local
    one = next(line for line in table.splitlines() if line.startswith("| one-pseudo"))
    assert one.startswith("| one-pseudo | 2 | 1.5000 |  | 2.0000 |"), one
    assert "1.5 % of their norm in blockwise8bit (fedcba9, 2026-11-29)" in table


def test_runs_under_churn_or_rogues_get_their_own_table_named_by_the_stress(tmp_path):
    path = tmp_path / "runs.jsonl"
    rows = [study_row("one-pseudo", 1, 2.0, [0, 0], [1, 1]), study_row("moshpit-mixed2", 1, 2.1, [0.1, 0.1], [2, 2]),
            {**study_row("one-pseudo", 1, 2.2, [0, 0], [1, 1]), "churn": 0.2, "rogues": 1},
            {**study_row("moshpit-mixed2", 1, 2.42, [0.1, 0.1], [2, 2]), "churn": 0.2, "rogues": 1}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    table = group_study.report([path]).splitlines()
    headings = [line for line in table if line.startswith("16 replicas")]
    assert len(headings) == 2 and "each away a round at 20 %, 1 rogue (CenteredClip; honest replicas' losses)" in headings[1], headings
    stressed = table[table.index(headings[1]):]
    assert next(line for line in stressed if line.startswith("| moshpit-mixed2")).startswith("| moshpit-mixed2 | 1 | 2.4200 | +10.00 % |")
