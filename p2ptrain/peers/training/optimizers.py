"""Optimizers and learning-rate schedules of ``sync`` runs.

``make_optimizer`` builds the manifest's optimizer (AdamW or LAMB) and
``make_scheduler`` its schedule. The schedule is a function of the *global*
epoch: hivemind.Optimizer steps it once per epoch of the whole swarm (see
``hivemind.optim.state_averager.TrainingStateAverager._update_scheduler``), so
every peer uses the same learning rate whatever its own speed.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable

import torch

OPTIMIZERS = ("adamw", "lamb")
LR_SCHEDULES = ("constant", "cosine", "linear")


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning", Algorithm 2).

    Adam's bias-corrected update ``r = m_hat / (sqrt(v_hat) + eps)`` plus decoupled
    weight decay ``u = r + weight_decay * w`` is scaled per tensor by the trust
    ratio ``||w|| / ||u||`` (1 when either norm is zero), so every layer moves by
    about the same fraction of its weights whatever the batch size:
    ``w <- w - lr * trust_ratio * u``.

    Args:
        params: the parameters (or parameter groups) to train.
        lr: the learning rate.
        betas: decay of the first and second moment estimates.
        eps: added to the square root of the second moment.
        weight_decay: decoupled weight decay, part of the update the trust ratio scales.
    """

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.01):
        if not lr > 0:
            raise ValueError(f"LAMB learning rate must be > 0, not {lr}")
        if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"LAMB betas must be in [0, 1), not {betas}")
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for parameter in group["params"]:
                if parameter.grad is None:
                    continue
                gradient = parameter.grad.float()
                state = self.state[parameter]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(parameter, dtype=torch.float32)
                    state["exp_avg_sq"] = torch.zeros_like(parameter, dtype=torch.float32)
                state["step"] += 1
                step = float(state["step"])
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                exp_avg.mul_(beta1).add_(gradient, alpha=1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(gradient, gradient, value=1 - beta2)
                corrected_avg = exp_avg / (1 - beta1 ** step)
                corrected_avg_sq = exp_avg_sq / (1 - beta2 ** step)
                weights = parameter.float()
                update = corrected_avg / (corrected_avg_sq.sqrt() + group["eps"])
                if group["weight_decay"]:
                    update.add_(weights, alpha=group["weight_decay"])
                weight_norm, update_norm = weights.norm(), update.norm()
                trust_ratio = torch.where((weight_norm > 0) & (update_norm > 0), weight_norm / update_norm,
                                          torch.ones_like(weight_norm))
                parameter.copy_(weights - group["lr"] * trust_ratio * update)
        return loss


def make_optimizer(name: str, parameters: Iterable[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """The optimizer named by the manifest: "adamw" (torch's AdamW) or "lamb" (:class:`Lamb`)."""
    if name == "adamw":
        return torch.optim.AdamW(parameters, lr=lr)
    if name == "lamb":
        return Lamb(parameters, lr=lr)
    raise ValueError(f"unknown optimizer {name!r}; use one of {', '.join(OPTIMIZERS)}")


def learning_rate_factor(epoch: int, warmup_epochs: int = 0, schedule: str = "constant",
                         total_epochs: int | None = None) -> float:
    """The multiplier of the base learning rate at global ``epoch`` (0-based).

    Args:
        epoch: the swarm's epoch.
        warmup_epochs: the factor rises linearly over this many epochs, reaching 1
            at epoch ``warmup_epochs`` - 1.
        schedule: after warm-up, "constant" keeps 1; "cosine" and "linear" decay
            to 0 at ``total_epochs``, which they need.
        total_epochs: the run's planned length in epochs (warm-up included).
    """
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"unknown learning-rate schedule {schedule!r}; use one of {', '.join(LR_SCHEDULES)}")
    if epoch < warmup_epochs:
        return (epoch + 1) / warmup_epochs
    if schedule == "constant":
        return 1.0
    if total_epochs is None:
        raise ValueError(f"the {schedule!r} schedule decays to 0 at total_epochs; give total_epochs")
    progress = min(1.0, (epoch - warmup_epochs) / max(1, total_epochs - warmup_epochs))
    if schedule == "cosine":
        return 0.5 * (1 + math.cos(math.pi * progress))
    return 1.0 - progress


def make_scheduler(warmup_epochs: int, schedule: str, total_epochs: int | None):
    """A factory ``optimizer -> LambdaLR`` for hivemind.Optimizer's ``scheduler``, or None for a constant rate."""
    if warmup_epochs == 0 and schedule == "constant":
        return None
    learning_rate_factor(0, warmup_epochs, schedule, total_epochs)  # bad settings fail here, not mid-run

    def factory(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda epoch: learning_rate_factor(epoch, warmup_epochs, schedule, total_epochs))

    return factory
