"""DiLoCo's outer step, checked against a hand computation (no hivemind)."""

import torch

import pytest

from p2ptrain.peers.training.diloco_math import (
    apply_outer_step,
    inner_lr_factor,
    make_outer_optimizer,
    momentum_buffers,
    pseudo_gradients,
    rebase_local,
    take_outer_step,
)
from p2ptrain.peers.training.sample_account import SampleAccount
from p2ptrain.peers.training.sync import all_finite


def test_two_averaged_local_results_give_a_nesterov_step():
    global_parameter = torch.tensor([1.0, 2.0, -1.0])
    local_a = torch.tensor([0.5, 2.5, -1.0])  # pseudo-gradient [0.5, -0.5, 0]
    local_b = torch.tensor([0.9, 1.0, -2.0])  # pseudo-gradient [0.1, 1.0, 1.0]
    averaged = [(pseudo_gradients([global_parameter], [local_a])[0] + pseudo_gradients([global_parameter], [local_b])[0]) / 2]
    assert torch.allclose(averaged[0], torch.tensor([0.3, 0.25, 0.5]))

    outer_lr, momentum = 0.7, 0.9
    global_parameters = [global_parameter.clone()]
    optimizer = make_outer_optimizer(global_parameters, outer_lr, momentum)
    model_parameter = torch.nn.Parameter(local_a.clone())
    apply_outer_step(global_parameters, averaged, optimizer, [model_parameter])

    # Nesterov, first step: buffer = g, update = g + momentum * buffer
    g = torch.tensor([0.3, 0.25, 0.5])
    expected = torch.tensor([1.0, 2.0, -1.0]) - outer_lr * (g + momentum * g)
    assert torch.allclose(global_parameters[0], expected)
    assert torch.allclose(momentum_buffers(optimizer)[0], g)
    assert torch.equal(model_parameter.data, global_parameters[0]), "local parameters reset to the new global ones"

    # second step with another averaged pseudo-gradient h: buffer = m*g + h, update = h + m*buffer
    h = torch.tensor([-0.1, 0.2, 0.0])
    apply_outer_step(global_parameters, [h], optimizer, [model_parameter])
    buffer = momentum * g + h
    assert torch.allclose(global_parameters[0], expected - outer_lr * (h + momentum * buffer))


def test_non_finite_pseudo_gradients_are_detected():
    assert all_finite([torch.ones(3)])
    assert not all_finite([torch.ones(3), torch.tensor([0.0, float("nan")])])
    assert not all_finite([torch.tensor([float("inf")])])


def test_outer_momentum_zero_is_plain_averaging_sgd():
    """``--outer-momentum 0`` is valid in a manifest; torch's Nesterov would refuse it."""
    global_parameters = [torch.tensor([1.0, 2.0])]
    optimizer = make_outer_optimizer(global_parameters, 1.0, 0.0)
    local = torch.nn.Parameter(torch.tensor([0.0, 0.0]))
    apply_outer_step(global_parameters, [torch.tensor([0.5, -1.0])], optimizer, [local])
    assert torch.allclose(global_parameters[0], torch.tensor([0.5, 3.0]))
    assert torch.equal(local.data, global_parameters[0])


def test_inner_lr_warms_up_and_decays_in_epochs_of_h_inner_steps():
    factor = inner_lr_factor(local_steps=10, warmup_epochs=2, lr_schedule="cosine", total_epochs=6)
    # warm-up over 2 epochs = 20 inner steps, linear
    assert factor(0) == pytest.approx(1 / 20)
    assert factor(9) == pytest.approx(10 / 20)
    assert factor(19) == pytest.approx(1.0)
    # cosine from step 20 to 0 at step 60: halfway (step 40) is 0.5
    assert factor(40) == pytest.approx(0.5)
    assert factor(60) == pytest.approx(0.0)
    assert factor(80) == pytest.approx(0.0)
    assert inner_lr_factor(local_steps=50)(12345) == 1.0


def test_inner_lr_schedule_without_an_end_is_refused():
    with pytest.raises(ValueError, match="total_epochs"):
        inner_lr_factor(local_steps=10, lr_schedule="linear")


def test_a_late_peer_keeps_its_delta_on_top_of_the_new_global_parameters():
    old_global, new_global = [torch.tensor([1.0, 2.0])], [torch.tensor([0.5, 3.0])]
    local = torch.nn.Parameter(torch.tensor([1.25, 1.0]))  # delta [0.25, -1.0] over the old global
    rebase_local([local], old_global, new_global)
    assert torch.allclose(local.data, torch.tensor([0.75, 2.0]))
    assert torch.allclose(pseudo_gradients(new_global, [local])[0], pseudo_gradients(old_global, [torch.tensor([1.25, 1.0])])[0])


def test_training_on_during_a_round_keeps_what_was_trained_since_on_the_new_global():
    """A peer sends global - local and trains on; when the average arrives, the outer step moves the
    global parameters and the progress since sending is kept on top of them (one round stale)."""
    global_parameters = [torch.tensor([1.0, 1.0])]
    sent_from = [torch.tensor([0.0, 2.0])]  # pseudo-gradient sent: [1, -1]
    local = torch.nn.Parameter(torch.tensor([-0.5, 2.5]))  # trained on by [-0.5, 0.5] since
    averaged = [torch.tensor([0.5, 0.5])]  # the swarm's weighted average
    optimizer = make_outer_optimizer(global_parameters, outer_lr=1.0, outer_momentum=0.0)
    take_outer_step(global_parameters, averaged, optimizer)
    rebase_local([local], sent_from, global_parameters)
    assert torch.allclose(global_parameters[0], torch.tensor([0.5, 0.5]))
    assert torch.allclose(local.data, torch.tensor([0.0, 1.0])), "new global + what was trained since sending"


def test_sample_account_keeps_every_trained_sample_in_one_place():
    account = SampleAccount()
    account.add_trained(100)
    account.add_contributed(60)
    account.add_unused("late", 25)
    assert account.pending == 15
    assert account.as_dict() == {"trained_samples": 100, "contributed_samples": 60,
                                 "unused_samples": {"late": 25, "failed_round": 0, "rejected": 0}}
    restored = SampleAccount()
    restored.load_dict(account.as_dict())
    assert restored == account
    with pytest.raises(ValueError, match="use one of late, failed_round, rejected"):
        account.add_unused("slow", 1)


def test_a_checkpoint_of_an_older_p2ptrain_counted_every_sample_as_contributed():
    account = SampleAccount()
    account.load_dict({"contributed_samples": 336})
    assert (account.trained, account.contributed, account.pending) == (336, 336, 0)
