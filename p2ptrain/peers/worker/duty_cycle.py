"""The training loop's duty cycle: rest after each step so that it computes at most a share of the time.

BOINC's "use at most X % of CPU time", for p2ptrain's ``policy.max_compute_share``:
a laptop that trains at 0.5 runs cooler and quieter, and a machine that hosts
many peers (the scale lab) leaves cores free for the ones starting. After a
step that computed for ``c`` seconds the loop rests ``c × (1 / share − 1)``
seconds, answering the daemon's commands meanwhile; averaging, state downloads
and the DHT go on in their own threads and processes, so a round the swarm
starts while the loop rests begins at most one rest late.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class DutyCycle:
    """When the training loop may compute its next step.

    Args:
        share: the most of the wall time the loop computes, in (0, 1]; 1 never rests.
        clock: monotonic seconds (a parameter for tests).
    """

    def __init__(self, share: float, clock: Callable[[], float] = time.monotonic):
        if not 0 < share <= 1:
            raise ValueError(f"a compute share must be in (0, 1], not {share}")
        self.share, self.clock = share, clock
        self.rest_until = 0.0

    def computed(self, seconds: float) -> float:
        """A step computed for ``seconds``: start its rest now; returns the rest's length."""
        rest = max(0.0, seconds) * (1 / self.share - 1)
        self.rest_until = self.clock() + rest
        return rest

    def rest_left_s(self) -> float:
        """Seconds until the next step may compute (0: now)."""
        return max(0.0, self.rest_until - self.clock())
