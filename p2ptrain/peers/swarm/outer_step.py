"""DiLoCo's outer step: its defaults, and the settings the DiLoCo study found unstable.

Once its momentum has built up, an outer Nesterov step moves the global parameters by
``outer_lr / (1 - outer_momentum)`` times the progress the swarm made in the round (for
progress in a steady direction: the momentum buffer sums to ``1 / (1 - momentum)`` rounds'
worth, and Nesterov looks one round ahead). That ratio is the *step to progress*. The
DiLoCo paper's 0.7 and 0.9 make it 7: each round's progress, noise included, is
extrapolated sevenfold. The paper averages hundreds of inner steps of many workers, whose
noise cancels; a peer alone (every run starts as one: its creator) or a round of a few
inner steps extrapolates its own noise. On a GPU a lone creator's LoRA run went from loss
4.9 to 14.3 in 40 s that way, then to non-finite gradients for good.

The study (``benchmarks/diloco_study.py --stability``, ``benchmarks/RESULTS.md``) measured
the ratio against plain AdamW on the same samples, for a lone peer and four, rounds of 10
and 50 inner steps: up to 1.4 every setting ended within 1.5 % of AdamW; at 2 a lone peer
ended 4-5 % above it; at 7 and 10 a lone peer ended 9-33 % above, or diverged (four peers:
up to 8.7 %). So the default is the plain average of the peers' models (outer lr 1, no
momentum: a lone peer trains exactly as AdamW does), and ``join --new-run`` warns above
``MAX_STABLE_STEP_TO_PROGRESS``.

Importable without torch (the daemon checks a new run's settings with it).
"""

from __future__ import annotations

DEFAULT_OUTER_LR = 1.0
DEFAULT_OUTER_MOMENTUM = 0.0
# the defaults of manifests before format 4 (the DiLoCo paper's), which such manifests keep
PAPER_OUTER_LR = 0.7
PAPER_OUTER_MOMENTUM = 0.9
# the largest step to progress the study found stable for a lone peer and short rounds
MAX_STABLE_STEP_TO_PROGRESS = 1.5


def step_to_progress(outer_lr: float, outer_momentum: float) -> float:
    """How many times a round's progress the outer step moves the global parameters, momentum built up."""
    return outer_lr / (1.0 - outer_momentum)


def stability_warning(mode: str, outer_lr: float, outer_momentum: float) -> str | None:
    """One line for the creator of a run whose outer step the study found unstable, else None.

    Args:
        mode: the run's mode; only ``diloco`` has an outer step.
        outer_lr, outer_momentum: the run's outer Nesterov SGD.
    """
    ratio = step_to_progress(outer_lr, outer_momentum)
    if mode != "diloco" or ratio <= MAX_STABLE_STEP_TO_PROGRESS:
        return None
    return (f"outer lr {outer_lr:g} with momentum {outer_momentum:g} moves the model {ratio:.1f}x each round's progress: "
            f"above {MAX_STABLE_STEP_TO_PROGRESS:g}x the DiLoCo study found a lone peer or short rounds degrade or diverge "
            f"(benchmarks/RESULTS.md); the default is --outer-lr {DEFAULT_OUTER_LR:g} --outer-momentum {DEFAULT_OUTER_MOMENTUM:g}")
