"""Each training worker's state: the states, the one table of moves between them, and their owner.

A worker's state is the daemon's word for what its process is doing (``status.local.workers[].state``;
the daemon's own state is ``state.py``'s):

    joining -> training -> pausing -> paused -> joining ...
                        -> finished (after ``finish``)
    (any running state) -> restarting / oom-backoff (it crashed) -> joining

``joining`` from its start, then what the worker reports (``training``; it reports it right after
``joined``); ``pausing`` from a pause until the worker has checkpointed and left, then ``paused``
(or ``finished``, after a ``finish``) while it is gone; ``restarting`` or ``oom-backoff`` between a
crash and the next start.

``WorkerStates.move`` is the only writer of a worker's state (``tests/unit/test_worker_state.py``
checks that no other module assigns one): it refuses a move ``TRANSITIONS`` lacks (logs it; raises
where ``P2PTRAIN_STRICT_STATES`` is set, as the tests set it) and tells its listener of every move.
"""

from __future__ import annotations

import logging
import os
from enum import StrEnum
from typing import Protocol

log = logging.getLogger(__name__)

STRICT_ENV = "P2PTRAIN_STRICT_STATES"


class WorkerState(StrEnum):
    """A worker's state; the values are on the wire (``status``), read by the CLI, the TUI and tests."""

    JOINING = "joining"  # started (or restarted), not in the swarm yet
    TRAINING = "training"  # in the swarm, training
    PAUSING = "pausing"  # told to pause (or it said it paused): checkpointing and leaving, its process still runs
    PAUSED = "paused"  # ended for a pause: no process
    FINISHED = "finished"  # completed its epoch after a ``finish`` (its process ends next, or has ended)
    RESTARTING = "restarting"  # crashed: started again after its back-off
    OOM_BACKOFF = "oom-backoff"  # ran out of memory: started again after its back-off, with half the micro-batch


JOINING, TRAINING, PAUSING, PAUSED, FINISHED, RESTARTING, OOM_BACKOFF = WorkerState

# Every move a worker's state may make (staying where it is is always allowed, and changes nothing).
# Who makes each: WorkerPool.start (-> joining), WorkerPool.release_all (-> pausing), WorkerReports.state_changed
# (-> training, pausing, finished), WorkerPool.schedule_restart (-> restarting, oom-backoff), RunControl._released
# (-> paused, finished) and RunControl._restore_paused_view (a restarted daemon, paused: -> paused).
TRANSITIONS: dict[WorkerState, frozenset[WorkerState]] = {
    # it joins; it is paused while joining (or a worker started paused says so); it ends (crash, or a pause)
    JOINING: frozenset({TRAINING, PAUSING, FINISHED, PAUSED, RESTARTING, OOM_BACKOFF}),
    TRAINING: frozenset({PAUSING, FINISHED, PAUSED, RESTARTING, OOM_BACKOFF}),
    # a worker that had joined before it was told to pause may still report training (or finishing its epoch)
    PAUSING: frozenset({TRAINING, FINISHED, PAUSED, RESTARTING, OOM_BACKOFF}),
    # a finished worker still running is ended by a pause; one that has ended starts again at resume
    FINISHED: frozenset({PAUSING, PAUSED, RESTARTING, OOM_BACKOFF, JOINING}),
    PAUSED: frozenset({JOINING}),
    RESTARTING: frozenset({JOINING}),
    OOM_BACKOFF: frozenset({JOINING}),
}


def allowed(before: WorkerState, after: WorkerState) -> bool:
    """Whether the table lets a worker in ``before`` move to ``after``."""
    return before == after or after in TRANSITIONS[before]


class ForbiddenMove(RuntimeError):
    """A move the table lacks (raised where ``P2PTRAIN_STRICT_STATES`` is set)."""


class HasState(Protocol):
    """What ``WorkerStates`` moves: a worker's view (``run_view.WorkerView``)."""

    state: WorkerState


class WorkerStateListener(Protocol):
    """Told of every move of a worker's state (the daemon's ``RunControl``)."""

    def worker_moved(self, name: str, before: WorkerState, after: WorkerState) -> None: ...


class WorkerStates:
    """The only writer of the workers' states.

    Args:
        strict: raise ``ForbiddenMove`` for a move the table lacks (None: when ``P2PTRAIN_STRICT_STATES``
            is set); else it is logged and refused.

    Attributes:
        listener: told of every move (None: nobody).
    """

    def __init__(self, strict: bool | None = None):
        self.strict = bool(os.environ.get(STRICT_ENV)) if strict is None else strict
        self.listener: WorkerStateListener | None = None

    def move(self, name: str, view: HasState, to: WorkerState | str) -> bool:
        """Move worker ``name`` (its view ``view``) to ``to``; returns whether it moved (False: refused).

        Raises:
            ValueError: ``to`` is no worker state.
            ForbiddenMove: the table lacks the move, and this owner is strict.
        """
        after = WorkerState(to)
        before = WorkerState(view.state)
        if not allowed(before, after):
            message = f"worker {name}: no move from {before} to {after} (worker_state.TRANSITIONS)"
            if self.strict:
                raise ForbiddenMove(message)
            log.error("refused: %s", message)
            return False
        view.state = after
        if self.listener is not None:
            self.listener.worker_moved(name, before, after)
        return True
