"""The daemon's states, and the desired state that survives restarts.

``idle`` -> ``joining`` -> ``training`` <-> ``paused`` -> ``leaving`` -> ``idle``;
``finishing`` completes the current epoch, then ``paused``; ``error`` carries
a message and a fix. Every pause has a ``pause_reason``.
Each worker's own state (``pausing``, ``restarting``...) is ``worker_state.py``'s.

What the user asked for (the run to be in, paused or not, until when) is the
*desired* state: it is written to the ``settings`` table at every change, so a
restarted daemon (or machine) goes back to it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

IDLE = "idle"
JOINING = "joining"
TRAINING = "training"
PAUSED = "paused"
FINISHING = "finishing"
LEAVING = "leaving"
ERROR = "error"
STATES = (IDLE, JOINING, TRAINING, PAUSED, FINISHING, LEAVING, ERROR)
IN_RUN = (JOINING, TRAINING, PAUSED, FINISHING)

# a worker ran out of memory and no other is in the swarm: paused until its back-off is over (it then starts again)
OOM_BACKOFF = "oom-backoff"
PAUSE_REASONS = ("user", "user-active", "battery", "gpu-busy", "temperature", "schedule", "traffic-budget",
                 OOM_BACKOFF, "diverged")
# Reasons a policy sets and clears by itself; a user pause is only ended by the user (or its timer), and
# so is ``diverged``: a worker's divergence guard rolled its training back too often (peers/training/divergence.py).
POLICY_REASONS = ("user-active", "battery", "gpu-busy", "temperature", "schedule", "traffic-budget")

DESIRED_STATE_KEY = "desired_state"
# the run as a paused daemon shows it (``RunView.snapshot``), for a restart while paused
PAUSED_VIEW_KEY = "paused_view"


@dataclass
class DesiredState:
    """What the user asked for; persisted under ``settings[DESIRED_STATE_KEY]``.

    Attributes:
        run: the join request to keep honouring (``run_id``, ``initial_peers``,
            ``new_run``, ``manifest``), or None when not in a run.
        paused: the user paused (or finish completed an epoch, or training diverged).
        pause_until: wall-clock time at which a timed user pause ends by itself.
        pause_reason: why it is paused when not by the user: ``diverged`` (None: ``user``).
    """

    run: dict[str, Any] | None = None
    paused: bool = False
    pause_until: float | None = None
    pause_reason: str | None = None

    @classmethod
    def from_dict(cls, data: Any) -> "DesiredState":
        if not isinstance(data, dict):
            return cls()
        return cls(
            run=data.get("run") if isinstance(data.get("run"), dict) else None,
            paused=bool(data.get("paused", False)),
            pause_until=data.get("pause_until") if isinstance(data.get("pause_until"), (int, float)) else None,
            pause_reason=data.get("pause_reason") if data.get("pause_reason") in PAUSE_REASONS else None,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Lifecycle:
    """The state the daemon is in now (not persisted: it is derived again at start)."""

    state: str = IDLE
    pause_reason: str | None = None
    since: float = field(default_factory=time.time)
    error: dict[str, str] | None = None

    def enter(self, state: str, pause_reason: str | None = None, error: dict[str, str] | None = None) -> bool:
        """Move to ``state``; returns whether anything changed."""
        if state not in STATES:
            raise ValueError(f"unknown state {state!r}")
        if state == PAUSED and pause_reason not in PAUSE_REASONS:
            raise ValueError(f"a pause needs one of the reasons {PAUSE_REASONS}, not {pause_reason!r}")
        reason = pause_reason if state == PAUSED else None
        if (state, reason, error) == (self.state, self.pause_reason, self.error):
            return False
        if state != self.state:
            self.since = time.time()
        self.state, self.pause_reason, self.error = state, reason, error if state == ERROR else None
        return True
