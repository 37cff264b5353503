"""How the worker pipe's dataclasses become plain dicts and back, every field's type checked.

``Message`` is the base of every dataclass in ``worker_pipe.py``: ``to_dict``
gives plain dicts, lists and scalars (what a pipe or a spawned process's
arguments carry best); ``from_dict`` rebuilds the dataclass and checks each
field against its annotation (``str``, ``int``, ``float``, ``bool``, ``dict``,
``list[...]``, ``X | None``, ``Literal[...]``, nested messages and the control
protocol's records, ``control_types.Record``, such as ``PeerRow``), so what
the other process sent is either exactly the message or a ``MalformedMessage``
naming the field, in one line.

Stdlib only.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, Literal

from p2ptrain.control_types import MalformedReply, Record, shown


class MalformedMessage(ValueError):
    """A dict that is not the message it claims to be; ``str()`` says what is wrong, in one line."""


class Message:
    """Base of the pipe's dataclasses: ``to_dict`` and a type-checked ``from_dict``."""

    def to_dict(self) -> dict[str, Any]:
        """The message as plain dicts, lists and scalars (nested messages and records included)."""
        return {field.name: _plain(getattr(self, field.name)) for field in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: Any, where: str = ""):
        """Build the message from ``to_dict``'s form, checking each field's type.

        Args:
            data: the dict.
            where: what it is, for the error message (default: the class name).

        Raises:
            MalformedMessage: ``data`` is not a dict, lacks a field without a
                default, has a key that is no field, or a field has the wrong type.
        """
        return _from_dict(cls, data, where or cls.__name__)


def _plain(value: Any) -> Any:
    if isinstance(value, (Message, Record)):
        return value.to_dict()
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


# ----- checking types --------------------------------------------------------------


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {field.name: hints[field.name] for field in dataclasses.fields(cls)}


def _from_dict(cls: type, data: Any, where: str):
    if not isinstance(data, dict):
        raise MalformedMessage(f"{where} must be a dict, not {shown(data)}")
    unknown = set(data) - set(_field_types(cls))
    if unknown:
        raise MalformedMessage(f"{where} has no field {', '.join(sorted(map(str, unknown)))}")
    values = {}
    for field in dataclasses.fields(cls):
        if field.name in data:
            values[field.name] = _checked(data[field.name], _field_types(cls)[field.name], f"{where}: {field.name}")
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise MalformedMessage(f"{where} has no {field.name}")
    return cls(**values)


def _checked(value: Any, hint: Any, where: str) -> Any:
    """``value`` if it has type ``hint`` (nested messages built from their dicts), else MalformedMessage."""
    origin, arguments = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        for option in arguments:
            try:
                return _checked(value, option, where)
            except MalformedMessage:
                continue
    elif origin is Literal:
        if value in arguments:
            return value
    elif origin is list or hint is list:
        if isinstance(value, list):
            item = arguments[0] if arguments else Any
            return [_checked(element, item, f"{where}[{index}]") for index, element in enumerate(value)]
    elif origin is dict or hint is dict:
        if isinstance(value, dict) and all(isinstance(key, str) for key in value):
            item = arguments[1] if arguments else Any
            return {key: _checked(element, item, f"{where}.{key}") for key, element in value.items()}
    elif isinstance(hint, type) and issubclass(hint, Message):
        return _from_dict(hint, value, where)
    elif isinstance(hint, type) and issubclass(hint, Record):
        try:
            return hint.from_dict(value, where)
        except MalformedReply as error:
            raise MalformedMessage(str(error)) from None
    elif hint is Any:
        return value
    elif hint is type(None):
        if value is None:
            return None
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif isinstance(value, hint):  # str, bool
        return value
    raise MalformedMessage(f"{where} must be {_named(hint)}, not {shown(value)}")


def _named(hint: Any) -> str:
    if typing.get_origin(hint) is Literal:
        return "one of " + ", ".join(map(repr, typing.get_args(hint)))
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")
