"""DiLoCo's outer step, checked against a hand computation (no hivemind)."""

import torch

from p2ptrain.peers.diloco import all_finite, apply_outer_step, make_outer_optimizer, momentum_buffers, pseudo_gradients


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
