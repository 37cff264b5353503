"""Both trainers have everything the worker's loop uses of a trainer (``peers/training/trainer.py``)."""

from __future__ import annotations

import inspect

import pytest

from p2ptrain.peers.training.diloco import DiLoCoTrainer
from p2ptrain.peers.training.diloco_rounds import SwarmRoundTrainer
from p2ptrain.peers.training.sync import SyncTrainer
from p2ptrain.peers.training.trainer import Trainer

METHODS = sorted(name for name, member in vars(Trainer).items() if inspect.isfunction(member) and not name.startswith("_"))
# members a trainer may hold as attributes set in __init__ rather than define on the class
ATTRIBUTES = sorted([*Trainer.__annotations__, *(name for name, member in vars(Trainer).items() if isinstance(member, property))])


@pytest.mark.parametrize("trainer", [SyncTrainer, DiLoCoTrainer, SwarmRoundTrainer])
def test_a_trainer_has_every_method_of_the_protocol_with_its_arguments(trainer):
    assert METHODS, "the protocol lost its methods"
    for name in METHODS:
        ours, promised = inspect.signature(getattr(trainer, name)), inspect.signature(getattr(Trainer, name))
        assert list(ours.parameters) == list(promised.parameters), f"{trainer.__name__}.{name}{ours} is not {name}{promised}"


@pytest.mark.parametrize("trainer", [SyncTrainer, DiLoCoTrainer, SwarmRoundTrainer])
def test_a_trainer_has_every_attribute_of_the_protocol(trainer):
    assigned_in_init = "".join(inspect.getsource(cls.__init__) for cls in trainer.__mro__ if "__init__" in vars(cls) and cls is not object)
    for name in ATTRIBUTES:
        assert isinstance(getattr(trainer, name, None), property) or f"self.{name} =" in assigned_in_init, f"{trainer.__name__} has no {name}"
