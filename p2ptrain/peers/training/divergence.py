"""The divergence guard: a worker notices its own training diverge, undoes it, and says so.

A volunteer swarm trains for weeks and nobody watches the loss. On a real GPU a lone
DiLoCo peer with a too-large outer step went from loss 4.9 to 14.3 in 40 s, then hit
non-finite gradients on every batch for good: 700 skipped batches, nothing used, and
the checkpoint written at stop held the diverged model. The guard sees each step's
loss (or that it was not finite) and says when training has *diverged*:

- ``non_finite_steps`` batches in a row had a non-finite loss or gradient (one now
  and then is fp16/bf16 overflow and only skipped; a run of them is a model that
  went bad), or
- ``spike_steps`` steps in a row had a loss far above its recent level. The level is
  the median of the last ``window`` healthy step losses, its spread their median
  absolute deviation (MAD, scaled by 1.4826 to estimate a standard deviation): a loss
  is far above it when its robust z-score ``(loss - median) / (1.4826 * MAD)`` passes
  ``spike_z`` *and* it is ``spike_rise`` above the median (a very steady loss has a
  tiny MAD, and a few percent is noise, not divergence). Median and MAD ignore the odd
  hard batch, so one outlier moves nothing; only ``min_history`` healthy steps make a
  level (before that, only non-finite batches count). Steps under suspicion do not
  enter the history, so a divergence cannot raise the level it is measured against.

Then the worker rolls back to the last good state (``training_worker``: its last
checkpoint, which only a state that passed this guard is written to, then the swarm's
state when the swarm is ahead) and lowers this peer's own learning rate by
``lr_factor`` per rollback; after ``calm_steps`` healthy steps without another
divergence the rate is restored and the rollbacks are forgiven. The
``max_rollbacks``-th divergence within that time pauses the worker (``paused
(diverged)``): the run's settings, not bad luck, are the cause, and the volunteer's
machine should not burn power on them.

The defaults keep a run that never diverges untouched (``benchmarks/RESULTS.md``
measures the guard's cost) and catch the GPU run's divergence within a few steps.
This module is pure Python (no torch), so its rules are unit-tested on plain numbers.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import deque

# 1.4826 x MAD estimates the standard deviation of normally distributed values
MAD_TO_SIGMA = 1.4826


@dataclasses.dataclass(frozen=True)
class GuardSettings:
    """The guard's thresholds (see the module docstring for each rule).

    Args:
        window: healthy step losses the recent level is the median of.
        min_history: healthy steps needed before a loss spike can be judged.
        spike_z: robust z-score above which a step's loss is far above the level.
        spike_rise: ...and the least rise over the median, as a fraction of it.
        spike_steps: steps in a row far above the level that make a divergence.
        non_finite_steps: batches in a row with a non-finite loss or gradient that make a divergence.
        lr_factor: this peer's learning rate is multiplied by this at each rollback.
        calm_steps: healthy steps after the last rollback that restore the rate and forgive the rollbacks.
        max_rollbacks: the divergence that would be this many rollbacks within ``calm_steps`` pauses instead.
    """

    window: int = 50
    min_history: int = 20
    spike_z: float = 6.0
    spike_rise: float = 0.25
    spike_steps: int = 3
    non_finite_steps: int = 5
    lr_factor: float = 0.5
    calm_steps: int = 500
    max_rollbacks: int = 3

    def __post_init__(self):
        if not (1 <= self.min_history <= self.window and self.spike_steps >= 1 and self.non_finite_steps >= 1
                and self.max_rollbacks >= 1 and self.calm_steps >= 1 and 0 < self.lr_factor < 1
                and self.spike_z > 0 and self.spike_rise >= 0):
            raise ValueError(f"inconsistent divergence guard settings: {self}")


@dataclasses.dataclass(frozen=True)
class Divergence:
    """Why the guard judged training diverged.

    reason: ``non-finite`` or ``loss-spike``.
    steps: the steps in a row that made it.
    level: the recent healthy loss level (median), or None before there was one.
    loss: the last step's loss (None when it was not finite).
    rollbacks: rollbacks within the current calm period, this one included.
    pause: this divergence pauses the worker (``max_rollbacks`` reached) after its rollback.
    lr_scale: this peer's learning-rate multiplier from now on.
    """

    reason: str
    steps: int
    level: float | None
    loss: float | None
    rollbacks: int
    pause: bool
    lr_scale: float

    def describe(self) -> str:
        """One line for people: what was seen."""
        if self.reason == "non-finite":
            return f"{self.steps} batches in a row had a non-finite loss or gradient"
        return f"the loss rose to {self.loss:.3g} for {self.steps} steps, its recent level being {self.level:.3g}"


class DivergenceGuard:
    """Watches one worker's step losses (see the module docstring).

    Args:
        settings: the thresholds; the defaults unless given.

    Attributes:
        lr_scale: what this peer's own learning rate is multiplied by now (restored from a
            checkpoint by ``load_state_dict``: a worker resumed after a pause for divergence
            starts at the lowered rate).
        rollbacks: rollbacks since the last calm period.
    """

    def __init__(self, settings: GuardSettings | None = None):
        self.settings = settings or GuardSettings()
        self.lr_scale = 1.0
        self.rollbacks = 0
        self._history: deque[float] = deque(maxlen=self.settings.window)
        self._high_steps = 0
        self._non_finite_steps = 0
        self._calm_steps = 0
        self._diverging = False

    @property
    def level(self) -> float | None:
        """The recent healthy loss level (median of the window), or None before ``min_history`` steps."""
        if len(self._history) < self.settings.min_history:
            return None
        return statistics.median(self._history)

    @property
    def healthy(self) -> bool:
        """Whether the current state may be checkpointed: no step under suspicion now, and no
        divergence left without a rollback (``restored``)."""
        return self._high_steps == 0 and self._non_finite_steps == 0 and not self._diverging

    def restored(self) -> None:
        """The worker rolled back to a good state after the last ``Divergence``."""
        self._diverging = False

    def threshold(self) -> float | None:
        """The loss above which a step is far above the recent level (None before there is a level)."""
        level = self.level
        if level is None:
            return None
        spread = MAD_TO_SIGMA * statistics.median(abs(loss - level) for loss in self._history)
        return level + max(self.settings.spike_z * spread, self.settings.spike_rise * abs(level))

    def observe(self, loss: float | None) -> Divergence | None:
        """One step's mean loss, or None for a batch whose loss or gradient was not finite.

        Returns the ``Divergence`` when this step makes one (the worker rolls back then), else None.
        """
        if loss is None or loss != loss or loss in (float("inf"), float("-inf")):
            self._non_finite_steps += 1
            if self._non_finite_steps >= self.settings.non_finite_steps:
                return self._diverged("non-finite", self._non_finite_steps, None)
            return None
        self._non_finite_steps = 0
        threshold = self.threshold()
        if threshold is not None and loss > threshold:
            self._high_steps += 1
            if self._high_steps >= self.settings.spike_steps:
                return self._diverged("loss-spike", self._high_steps, loss)
            return None
        self._high_steps = 0
        self._history.append(loss)
        self._count_calm_step()
        return None

    def _count_calm_step(self) -> None:
        if self.rollbacks == 0 and self.lr_scale == 1.0:
            return
        self._calm_steps += 1
        if self._calm_steps >= self.settings.calm_steps:
            self.rollbacks, self.lr_scale, self._calm_steps = 0, 1.0, 0

    def _diverged(self, reason: str, steps: int, loss: float | None) -> Divergence:
        level = self.level
        self.rollbacks += 1
        self.lr_scale *= self.settings.lr_factor
        self._high_steps = self._non_finite_steps = self._calm_steps = 0
        self._diverging = True
        # the history stays: the rolled-back state trains at this level again. A state downloaded
        # from the swarm is judged by it too: a swarm that diverged as a whole is not followed
        return Divergence(reason, steps, level, loss, self.rollbacks, self.rollbacks >= self.settings.max_rollbacks,
                          self.lr_scale)

    def state_dict(self) -> dict:
        """What a checkpoint keeps of the guard: the lowered learning rate survives a pause for divergence."""
        return {"lr_scale": self.lr_scale}

    def load_state_dict(self, state: dict | None) -> None:
        """Restore ``state_dict``'s output (None: a checkpoint from before the guard, nothing to restore)."""
        if state:
            self.lr_scale = float(state.get("lr_scale", 1.0))
