"""A worker's state has one owner (``daemon/worker_state.py``): every move in its table works, a move the
table lacks is refused, and no other module of the daemon writes a worker's state."""

from __future__ import annotations

import ast
import logging
from dataclasses import dataclass
from pathlib import Path

import pytest

import p2ptrain
from p2ptrain.daemon.worker_state import (
    TRANSITIONS, ForbiddenMove, WorkerState, WorkerStates, allowed,
)

DAEMON_DIR = Path(p2ptrain.__file__).parent / "daemon"
OWNER = "worker_state.py"
# the daemon's own state (``Lifecycle.state``) is state.py's, and is no worker's
DAEMON_STATE = "state.py"
# the worker states that are no daemon state and no pause reason: only the owner spells them
WORKER_ONLY = {WorkerState.PAUSING.value, WorkerState.RESTARTING.value}


@dataclass
class View:
    state: WorkerState = WorkerState.JOINING


class Listener:
    def __init__(self):
        self.moves: list[tuple[str, WorkerState, WorkerState]] = []

    def worker_moved(self, name: str, before: WorkerState, after: WorkerState) -> None:
        self.moves.append((name, before, after))


ALLOWED = [(before, after) for before, afters in TRANSITIONS.items() for after in sorted(afters)]
FORBIDDEN = [(before, after) for before in WorkerState for after in WorkerState
             if before != after and after not in TRANSITIONS[before]]


def test_the_table_names_every_state_and_the_wire_values_are_unchanged():
    assert set(TRANSITIONS) == set(WorkerState)
    assert [state.value for state in WorkerState] == [
        "joining", "training", "pausing", "paused", "finished", "restarting", "oom-backoff"]
    # a worker that has ended comes back only by starting again
    for gone in (WorkerState.PAUSED, WorkerState.RESTARTING, WorkerState.OOM_BACKOFF):
        assert TRANSITIONS[gone] == {WorkerState.JOINING}


@pytest.mark.parametrize(("before", "after"), ALLOWED, ids=[f"{b}->{a}" for b, a in ALLOWED])
def test_each_allowed_move_moves_and_tells_the_listener(before, after):
    states, listener, view = WorkerStates(strict=True), Listener(), View(before)
    states.listener = listener
    assert states.move("gpu0", view, after.value)  # the wire value is taken too
    assert view.state is after
    assert listener.moves == [("gpu0", before, after)]


@pytest.mark.parametrize(("before", "after"), FORBIDDEN, ids=[f"{b}->{a}" for b, a in FORBIDDEN])
def test_a_move_the_table_lacks_raises_when_strict(before, after):
    view = View(before)
    with pytest.raises(ForbiddenMove, match=f"from {before} to {after}"):
        WorkerStates(strict=True).move("gpu0", view, after)
    assert view.state is before


def test_a_move_the_table_lacks_is_refused_and_logged_outside_the_tests(caplog):
    states, listener, view = WorkerStates(strict=False), Listener(), View(WorkerState.PAUSED)
    states.listener = listener
    with caplog.at_level(logging.ERROR, logger="p2ptrain.daemon.worker_state"):
        assert not states.move("gpu0", view, WorkerState.TRAINING)
    assert view.state is WorkerState.PAUSED and listener.moves == []
    assert "no move from paused to training" in caplog.text


def test_staying_is_allowed_and_an_unknown_state_is_an_error():
    assert all(allowed(state, state) for state in WorkerState)
    view = View(WorkerState.PAUSING)
    assert WorkerStates(strict=True).move("gpu0", view, WorkerState.PAUSING)
    with pytest.raises(ValueError):
        WorkerStates(strict=True).move("gpu0", view, "sleeping")


def test_the_tests_run_strict():
    assert WorkerStates().strict, "tests/conftest.py sets P2PTRAIN_STRICT_STATES, for the daemons the tests start too"


def state_writes(tree: ast.AST) -> list[int]:
    """Lines that assign an attribute named ``state`` (also in a tuple, or through ``setattr``)."""
    lines = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value == "state"):
            lines.append(node.lineno)
        while targets:
            target = targets.pop()
            if isinstance(target, (ast.Tuple, ast.List)):
                targets.extend(target.elts)
            elif isinstance(target, ast.Attribute) and target.attr == "state":
                lines.append(target.lineno)
    return lines


def worker_only_literals(tree: ast.AST) -> list[int]:
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Constant) and node.value in WORKER_ONLY]


def offences(source: str) -> list[str]:
    tree = ast.parse(source)
    return ([f"{line}: assigns a state" for line in state_writes(tree)]
            + [f"{line}: spells a worker state" for line in worker_only_literals(tree)])


def test_no_module_of_the_daemon_but_the_owner_writes_a_worker_state():
    found = []
    for path in sorted(DAEMON_DIR.glob("*.py")):
        if path.name == OWNER:
            continue
        for offence in offences(path.read_text()):
            if path.name == DAEMON_STATE and "assigns" in offence:
                continue
            found.append(f"daemon/{path.name}:{offence}")
    assert not found, "a worker's state is moved only by daemon/worker_state.py (WorkerStates.move):\n" + "\n".join(found)


@pytest.mark.parametrize("source", [
    'view.state = "paused"',
    'self.run.workers[name].state = "joining"',
    'view.local, view.state = {}, state',
    'setattr(view, "state", "paused")',
    'view.stopped("pausing")',
])
def test_the_check_finds_a_state_written_outside_the_owner(source):
    assert offences(source)


def test_the_check_lets_reads_and_moves_through_the_owner_pass():
    assert not offences('if view.state == "paused":\n    self.run.states.move(name, view, PAUSING)')
