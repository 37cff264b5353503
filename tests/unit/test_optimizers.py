"""LAMB against a hand computation, and the learning-rate schedules of sync runs."""

import math

import pytest
import torch

from p2ptrain.peers.training.optimizers import Lamb, learning_rate_factor, make_optimizer, make_scheduler


def one_lamb_step(weights, gradient, **options):
    parameter = torch.nn.Parameter(torch.tensor(weights))
    optimizer = Lamb([parameter], **options)
    parameter.grad = torch.tensor(gradient)
    optimizer.step()
    return parameter.detach().tolist()


def test_one_lamb_step_matches_the_paper_by_hand():
    # step 1: bias-corrected m = g, v = g^2, so r = g / |g| = [1, -1]; with weight decay 0.1,
    # u = r + 0.1 * w = [1.3, -0.6]; trust ratio = ||w|| / ||u|| = 5 / sqrt(2.05)
    result = one_lamb_step([3.0, 4.0], [1.0, -2.0], lr=0.1, eps=0.0, weight_decay=0.1)
    ratio = 5 / math.sqrt(2.05)
    assert result == pytest.approx([3.0 - 0.1 * ratio * 1.3, 4.0 - 0.1 * ratio * -0.6], rel=1e-6)


def test_without_weight_decay_every_tensor_moves_by_lr_times_its_norm():
    result = one_lamb_step([3.0, 4.0], [1.0, -2.0], lr=0.1, eps=0.0, weight_decay=0.0)
    step = 0.1 * 5 / math.sqrt(2)
    assert result == pytest.approx([3.0 - step, 4.0 + step], rel=1e-6)
    moved = math.dist(result, [3.0, 4.0])
    assert moved == pytest.approx(0.1 * 5.0, rel=1e-6)  # lr * ||w||, whatever the gradient's scale


def test_zero_weights_take_a_plain_adam_step():
    # trust ratio 1 when ||w|| = 0 (freshly zeroed tensors, e.g. LoRA's B matrices)
    result = one_lamb_step([0.0, 0.0], [0.5, -4.0], lr=0.01, eps=0.0, weight_decay=0.01)
    assert result == pytest.approx([-0.01, 0.01], rel=1e-6)


def test_lamb_lowers_a_quadratic_loss():
    torch.manual_seed(0)
    parameter = torch.nn.Parameter(torch.randn(8))
    optimizer = make_optimizer("lamb", [parameter], lr=0.05)
    start = float((parameter.detach() ** 2).sum())
    for _ in range(50):
        optimizer.zero_grad()
        (parameter ** 2).sum().backward()
        optimizer.step()
    assert float((parameter.detach() ** 2).sum()) < 0.1 * start


def test_an_unknown_optimizer_names_the_choices():
    with pytest.raises(ValueError, match="adamw, lamb"):
        make_optimizer("sgd", [torch.nn.Parameter(torch.zeros(1))], lr=0.1)


def test_warmup_rises_linearly_then_cosine_and_linear_decay_to_zero_at_total_epochs():
    assert [learning_rate_factor(epoch, warmup_epochs=4) for epoch in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    cosine = [learning_rate_factor(epoch, 2, "cosine", total_epochs=6) for epoch in range(8)]
    assert cosine[:2] == [0.5, 1.0]
    assert cosine[2:] == pytest.approx([1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5, 0.5 * (1 + math.cos(3 * math.pi / 4)), 0.0, 0.0])
    assert [learning_rate_factor(epoch, 0, "linear", total_epochs=4) for epoch in range(5)] == [1.0, 0.75, 0.5, 0.25, 0.0]


def test_decaying_schedules_need_total_epochs():
    with pytest.raises(ValueError, match="give total_epochs"):
        make_scheduler(0, "cosine", None)
    assert make_scheduler(0, "constant", None) is None


def test_the_scheduler_follows_the_epoch_it_is_stepped_to():
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([parameter], lr=1.0)
    scheduler = make_scheduler(2, "linear", 4)(optimizer)
    rates = [optimizer.param_groups[0]["lr"]]
    for _ in range(4):
        optimizer.step()
        scheduler.step()
        rates.append(optimizer.param_groups[0]["lr"])
    assert rates == pytest.approx([0.5, 1.0, 1.0, 0.5, 0.0])
