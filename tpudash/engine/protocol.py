"""The engine's control pipe: every message either side sends, as a frozen dataclass, and their one encoding.

The dashboard sends commands: ``Describe``, ``Launch`` (run id, job, params
as text), ``Cancel`` (one run, or every run) and ``Release``. The engine
says ``Hello`` first (its pid, ``PROTOCOL_VERSION`` and its framework), then
``AcceleratorHeld`` (another engine on this host holds the accelerator; it
exits), or ``RuntimeReady`` (the description) or ``RuntimeFailed``, and for each run
``JobStarted`` and ``JobFinished``, or ``LaunchRefused``.

On the wire a message is one JSON object per line (``tpudash.childproc``):
its fields, its ``type``, and an ``id``: each command's id is echoed by the
replies that answer it. ``decode`` checks every field's type and names the
one that is wrong. Any change here changes ``PROTOCOL_VERSION``, which the
dashboard compares when the engine says hello (a dashboard and an engine
from two installs of tpudash).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar, Union

PROTOCOL_VERSION = 4
TYPE_FIELD = "type"


class ProtocolError(ValueError):
    """A message that is not what the protocol says; the text names its type and the field that is wrong."""


# -- commands: dashboard → engine ---------------------------------------------------


@dataclass(frozen=True)
class Describe:
    """Send the runtime's description again (answered by ``RuntimeReady`` once the runtime is up)."""

    TYPE: ClassVar[str] = "describe"


@dataclass(frozen=True)
class Launch:
    """Run ``job`` as ``run_id`` with ``params`` as a user would type them (validated again by the engine)."""

    TYPE: ClassVar[str] = "launch"
    run_id: str
    job: str
    params: dict[str, str]


@dataclass(frozen=True)
class Cancel:
    """Cancel run ``run_id`` (queued or running); None cancels every run."""

    TYPE: ClassVar[str] = "cancel"
    run_id: str | None = None


@dataclass(frozen=True)
class Release:
    """Cancel everything, record it, and exit (so another process can take the accelerator)."""

    TYPE: ClassVar[str] = "release"


# -- replies: engine → dashboard ---------------------------------------------------------


@dataclass(frozen=True)
class Hello:
    """The engine is up: its pid, the protocol it speaks and the framework it runs jobs on (``tensorflow``, ``jax``)."""

    TYPE: ClassVar[str] = "hello"
    pid: int
    protocol: int
    framework: str = "tensorflow"


@dataclass(frozen=True)
class AcceleratorHeld:
    """Another engine on this host holds the accelerator (``tpudash.engine.hostlock``); this one exits at once.

    ``holder`` names it (``LockHolder.describe``), ``lock_path`` is the lock file.
    """

    TYPE: ClassVar[str] = "held"
    holder: str
    lock_path: str


@dataclass(frozen=True)
class RuntimeReady:
    """The runtime detected (``RuntimeDescription.to_dict()``)."""

    TYPE: ClassVar[str] = "runtime"
    description: dict[str, Any]


@dataclass(frozen=True)
class RuntimeFailed:
    """The runtime could not be set up: the error, its message alone, and whether TensorFlow is missing."""

    TYPE: ClassVar[str] = "runtime_failed"
    error: str
    message: str
    missing_tensorflow: bool


@dataclass(frozen=True)
class JobStarted:
    """A run began: its record is in ``run_dir``."""

    TYPE: ClassVar[str] = "started"
    run_id: str
    run_dir: str


@dataclass(frozen=True)
class JobFinished:
    """A run ended (done, failed, cancelled), or was cancelled before it began (no record then)."""

    TYPE: ClassVar[str] = "finished"
    run_id: str
    status: str
    error: str | None


@dataclass(frozen=True)
class LaunchRefused:
    """A launch the engine cannot run: a job it does not have, params it rejects (a version skew)."""

    TYPE: ClassVar[str] = "refused"
    run_id: str
    error: str


Command = Describe | Launch | Cancel | Release
Reply = Hello | AcceleratorHeld | RuntimeReady | RuntimeFailed | JobStarted | JobFinished | LaunchRefused
Message = Command | Reply

COMMANDS: dict[str, type[Command]] = {kind.TYPE: kind for kind in (Describe, Launch, Cancel, Release)}
REPLIES: dict[str, type[Reply]] = {
    kind.TYPE: kind
    for kind in (Hello, AcceleratorHeld, RuntimeReady, RuntimeFailed, JobStarted, JobFinished, LaunchRefused)
}


def encode(message: Message) -> dict[str, Any]:
    """``message`` as a JSON object: its ``type`` and its fields."""
    payload: dict[str, Any] = {TYPE_FIELD: message.TYPE}
    for field in dataclasses.fields(message):
        payload[field.name] = getattr(message, field.name)
    return payload


# Each message's fields and their types, as ``decode`` checks them.
_FIELD_TYPES: dict[type, dict[str, Any]] = {
    kind: typing.get_type_hints(kind) for kind in (*COMMANDS.values(), *REPLIES.values())
}
MessageT = TypeVar("MessageT", Command, Reply)


def decode(payload: Mapping[str, Any], kinds: Mapping[str, type[MessageT]]) -> MessageT:
    """The message of ``kinds`` (``COMMANDS`` or ``REPLIES``) that ``payload`` is; ProtocolError if none.

    Fields it does not know (``id``, or a newer engine's additions) are ignored.
    """
    kind_name = payload.get(TYPE_FIELD)
    if not isinstance(kind_name, str):
        raise ProtocolError(f"a message without a {TYPE_FIELD!r}")
    kind = kinds.get(kind_name)
    if kind is None:
        raise ProtocolError(f"unknown message type {kind_name!r}")
    values: dict[str, Any] = {}
    for field in dataclasses.fields(kind):
        if field.name not in payload:
            if field.default is dataclasses.MISSING:
                raise ProtocolError(f"{kind_name}: field {field.name!r} is missing")
            continue
        value = payload[field.name]
        expected = _FIELD_TYPES[kind][field.name]
        if not _conforms(value, expected):
            raise ProtocolError(
                f"{kind_name}: field {field.name!r} should be {_type_name(expected)}, "
                f"got {type(value).__name__} {value!r:.60}"
            )
        values[field.name] = value
    return kind(**values)


def _conforms(value: Any, expected: Any) -> bool:
    origin = typing.get_origin(expected)
    if origin in (Union, types.UnionType):
        return any(_conforms(value, option) for option in typing.get_args(expected))
    if expected is Any:
        return True
    if expected is type(None):
        return value is None
    if expected is bool:
        return isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if expected is str:
        return isinstance(value, str)
    if origin is dict:
        key_type, value_type = typing.get_args(expected)
        return isinstance(value, dict) and all(
            _conforms(key, key_type) and _conforms(item, value_type) for key, item in value.items()
        )
    raise TypeError(f"the protocol has no check for {expected!r}")  # a field type added without one


def _type_name(expected: Any) -> str:
    if typing.get_origin(expected) in (Union, types.UnionType):
        return " or ".join(_type_name(option) for option in typing.get_args(expected))
    if expected is type(None):
        return "null"
    names = {bool: "a boolean", int: "an integer", str: "a string"}
    if expected in names:
        return names[expected]
    if typing.get_origin(expected) is dict:
        return "an object" if typing.get_args(expected)[1] is Any else "an object of strings"
    return str(expected)
