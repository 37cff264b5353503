"""Checkpoints are atomic, and unreadable ones are ignored, never fatal."""

import os

import torch

from p2ptrain.peers.model.checkpoint import load_checkpoint, non_finite_problem, save_checkpoint, set_aside, state_problem


def sample_state(manifest_hash="abc"):
    return {
        "trainable": {"weight": torch.arange(6.0).reshape(2, 3)},
        "trainer": {"epoch": 4, "outer_momentum": [torch.ones(3)]},
        "epoch": 4,
        "data_position": 1234,
        "manifest_hash": manifest_hash,
    }


def test_saved_checkpoint_round_trips(tmp_path):
    path = tmp_path / "run.pt"
    save_checkpoint(path, sample_state())
    loaded = load_checkpoint(path, manifest_hash="abc")
    assert loaded["epoch"] == 4 and loaded["data_position"] == 1234
    assert torch.equal(loaded["trainable"]["weight"], torch.arange(6.0).reshape(2, 3))
    assert [p.name for p in tmp_path.iterdir()] == ["run.pt"], "no temp file left behind"


def test_failed_write_keeps_the_previous_checkpoint(tmp_path):
    path = tmp_path / "run.pt"
    save_checkpoint(path, sample_state())

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("cannot pickle")

    try:
        save_checkpoint(path, {"bad": Unpicklable()})
    except RuntimeError:
        pass
    assert load_checkpoint(path)["epoch"] == 4
    assert [p.name for p in tmp_path.iterdir()] == ["run.pt"]


def test_truncated_checkpoint_is_ignored(tmp_path):
    path = tmp_path / "run.pt"
    save_checkpoint(path, sample_state())
    size = path.stat().st_size
    with open(path, "r+b") as file:
        file.truncate(size // 2)
    assert load_checkpoint(path) is None


def test_corrupt_and_foreign_files_are_ignored(tmp_path):
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(os.urandom(256))
    assert load_checkpoint(garbage) is None
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.ones(2)}, foreign)
    assert load_checkpoint(foreign) is None
    assert load_checkpoint(tmp_path / "missing.pt") is None


def test_checkpoint_of_another_manifest_is_refused(tmp_path):
    path = tmp_path / "run.pt"
    save_checkpoint(path, sample_state(manifest_hash="other"))
    assert load_checkpoint(path, manifest_hash="abc") is None
    assert load_checkpoint(path, manifest_hash="other") is not None


def test_state_problem_rejects_wrong_shapes_and_non_finite_values():
    mine = [torch.zeros(2, 3), torch.zeros(4)]
    assert state_problem(mine, [torch.ones(2, 3), torch.ones(4)]) is None
    assert "shape" in state_problem(mine, [torch.ones(3, 2), torch.ones(4)])
    assert "non-finite" in state_problem(mine, [torch.ones(2, 3), torch.tensor([1.0, float("nan"), 0, 0])])
    assert "expected 2 tensors" in state_problem(mine, [torch.ones(2, 3)])


def test_a_non_finite_value_anywhere_in_a_checkpoint_is_named():
    assert non_finite_problem(sample_state()) is None
    state = sample_state()
    state["trainer"]["outer_momentum"][0][1] = float("inf")  # not only the parameters: what a restore adopts too
    assert non_finite_problem(state) == "trainer/outer_momentum/0 holds non-finite values"
    state = sample_state()
    state["trainable"]["weight"][0, 0] = float("nan")
    assert non_finite_problem(state) == "trainable/weight holds non-finite values"


def test_a_checkpoint_set_aside_is_kept_where_neither_a_restart_nor_export_reads_it(tmp_path):
    path = tmp_path / "run.pt"
    save_checkpoint(path, sample_state())
    kept = set_aside(path, "non-finite")
    assert not path.exists() and kept.parent == tmp_path and kept.name.startswith("run.pt.non-finite-")
    assert list(tmp_path.glob("*.pt")) == [] and load_checkpoint(kept)["epoch"] == 4
