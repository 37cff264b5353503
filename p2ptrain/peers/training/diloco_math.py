"""DiLoCo's arithmetic on lists of tensors: pseudo-gradients, the outer step, re-basing local progress.

Pure functions (torch only), shared by both kinds of DiLoCo rounds
(``p2ptrain.peers.training.diloco``, ``p2ptrain.peers.training.diloco_rounds``) and checked
against hand computations in ``tests/unit/test_diloco_math.py``.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from p2ptrain.peers.training.optimizers import learning_rate_factor


def pseudo_gradients(global_parameters: Sequence[torch.Tensor], local_parameters: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``global - local`` for each parameter, in float32 on the global tensors' device."""
    return [
        global_parameter.float() - local_parameter.detach().to(global_parameter.device).float()
        for global_parameter, local_parameter in zip(global_parameters, local_parameters)
    ]


def make_outer_optimizer(global_parameters: Sequence[torch.Tensor], outer_lr: float, outer_momentum: float) -> torch.optim.SGD:
    """SGD with Nesterov momentum over the global parameters (plain SGD when ``outer_momentum`` is 0:
    torch's Nesterov needs a momentum), momentum buffers created up front (so their shapes are
    known before the first outer step, for state sharing)."""
    optimizer = torch.optim.SGD(list(global_parameters), lr=outer_lr, momentum=outer_momentum, nesterov=outer_momentum > 0)
    for parameter in optimizer.param_groups[0]["params"]:
        optimizer.state[parameter]["momentum_buffer"] = torch.zeros_like(parameter)
    return optimizer


def inner_lr_factor(local_steps: int, warmup_epochs: int = 0, lr_schedule: str = "constant",
                    total_epochs: int | None = None) -> Callable[[int], float]:
    """The inner learning rate's multiplier as a function of the run's inner step
    (``epoch * local_steps + inner steps done in this epoch``, 0-based): the
    manifest's warm-up and schedule with an epoch of ``local_steps`` inner steps.
    Raises ValueError for bad settings now, not mid-run."""
    warmup, total = warmup_epochs * local_steps, total_epochs * local_steps if total_epochs else None
    learning_rate_factor(0, warmup, lr_schedule, total)
    return lambda step: learning_rate_factor(step, warmup, lr_schedule, total)


def momentum_buffers(outer_optimizer: torch.optim.SGD) -> list[torch.Tensor]:
    """The outer optimizer's momentum buffers, in parameter order."""
    return [outer_optimizer.state[parameter]["momentum_buffer"] for parameter in outer_optimizer.param_groups[0]["params"]]


@torch.no_grad()
def apply_outer_step(
    global_parameters: Sequence[torch.Tensor],
    averaged_pseudo_gradients: Sequence[torch.Tensor],
    outer_optimizer: torch.optim.SGD,
    local_parameters: Sequence[torch.Tensor],
) -> None:
    """Take one outer step with the averaged pseudo-gradients, then reset the
    local parameters to the new global ones."""
    take_outer_step(global_parameters, averaged_pseudo_gradients, outer_optimizer)
    for local_parameter, global_parameter in zip(local_parameters, global_parameters):
        local_parameter.copy_(global_parameter.to(local_parameter.device, local_parameter.dtype))


@torch.no_grad()
def take_outer_step(global_parameters: Sequence[torch.Tensor], averaged_pseudo_gradients: Sequence[torch.Tensor],
                    outer_optimizer: torch.optim.SGD) -> None:
    """One outer step on the global parameters with the averaged pseudo-gradients (the local ones untouched)."""
    for global_parameter, pseudo_gradient in zip(global_parameters, averaged_pseudo_gradients):
        global_parameter.grad = pseudo_gradient.to(global_parameter.dtype).clone()
    outer_optimizer.step()
    outer_optimizer.zero_grad(set_to_none=True)


@torch.no_grad()
def rebase_local(local_parameters: Sequence[torch.Tensor], old_base: Sequence[torch.Tensor], new_base: Sequence[torch.Tensor]) -> None:
    """Keep ``local - old_base`` as the local progress, on top of ``new_base``:
    ``local += new_base - old_base``.

    A late peer re-bases its whole delta from the old global parameters onto the
    downloaded ones; a peer that trained on while its round was averaged re-bases
    what it trained since it sent its pseudo-gradient (``old_base``: the local
    parameters it sent it from) onto the new global parameters."""
    for local, old, new in zip(local_parameters, old_base, new_base):
        local.add_((new.float() - old.float()).to(local.device, local.dtype))
