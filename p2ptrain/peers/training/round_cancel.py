"""Averaging rounds a stopping worker can let go of.

A worker stops (SIGTERM from the daemon: a ``systemctl stop``, the demo's
Ctrl-C) while its training step may be waiting for an averaging round. When the
whole swarm stops at once, or this peer is the last one left, nobody comes to
that round, and the step would wait out the averaging timeout (30 s on loopback,
longer on the internet): past the worker's stop deadline, which then ends it
without its final checkpoint. hivemind's optimizer creates some of those rounds
inside its state averager, out of our reach; ``CancellableRounds``, mixed into
an averager before hivemind's class, remembers every round started without
waiting (``step(wait=False)``, which is how hivemind starts them too), and
``cancel_rounds`` ends them: the waiting step goes on as after a failed round.
A worker that leaves cancels only those that found no group (``without_group``):
hivemind's shutdown waits for a state round in flight, and one nobody is left to
join waited out the whole averaging timeout (120 s of a leave in the NAT lab).
"""

from __future__ import annotations

import threading

from hivemind.averaging import DecentralizedAverager
from hivemind.averaging.control import AveragingStage, StepControl


def before_group(control: StepControl) -> bool:
    """Whether the round of ``control`` is still before its group formed (nobody waits for this peer's part)."""
    return control.stage in (AveragingStage.IDLE, AveragingStage.LOOKING_FOR_GROUP)


class CancellableRounds(DecentralizedAverager):
    """A ``DecentralizedAverager`` whose rounds in flight can be cancelled from another thread."""

    def __init__(self, *args, **kwargs):
        self._rounds_lock = threading.Lock()
        self._rounds_in_flight: list[StepControl] = []
        super().__init__(*args, **kwargs)

    def step(self, *args, **kwargs):
        result = super().step(*args, **kwargs)
        if isinstance(result, StepControl):
            with self._rounds_lock:
                self._rounds_in_flight = [control for control in self._rounds_in_flight if not control.done()] + [result]
        return result

    def cancel_rounds(self, without_group: bool = False) -> None:
        """Cancel every round this averager started that has not finished (``without_group``: only those
        still before their group formed; a formed group's members wait for this peer's part)."""
        with self._rounds_lock:
            rounds = list(self._rounds_in_flight)
        for control in rounds:
            if not control.done() and (not without_group or before_group(control)):
                control.cancel()
