"""Params, job specs, the job context and validation.

A job is ``run(ctx, params) -> summary dict``. Its ``JobSpec`` declares the
params with their types, defaults and allowed values, so every front end (the
CLI's ``--set NAME=VALUE``, the TUI form) validates the same way and before
anything touches the accelerator. Job modules must not import tensorflow at
module level: listing jobs has to stay instant.
"""

from __future__ import annotations

import difflib
import importlib
import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobs.events import Event, Log, Progress

FRAMEWORKS = ("tensorflow", "jax")
"""What a job can run on: the engine's runtime says which (``Runtime.framework``)."""
PARAM_KINDS = ("int", "float", "bool", "str", "floats", "ints")
# The one set of spellings a bool param accepts, in any case, wherever it is typed.
TRUE_WORDS = ("true", "yes", "on", "1")
FALSE_WORDS = ("false", "no", "off", "0")
BOOL_SPELLINGS = ", ".join(f"{true}/{false}" for true, false in zip(TRUE_WORDS, FALSE_WORDS)) + " (any case)"


class ParamError(ValueError):
    """A param value that is not allowed; names the field and what is allowed."""

    def __init__(self, field_name: str, message: str):
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message


class FrameworkNotSupported(RuntimeError):
    """A job asked to run on a framework it has no runner for; says which and why."""

    def __init__(self, job: str, framework: str, why: str = ""):
        reason = f": {why}" if why else ""
        super().__init__(f"job {job!r} does not run on {framework}{reason}")
        self.job = job
        self.framework = framework


class JobCancelled(Exception):
    """Raised by ``JobContext.raise_if_cancelled`` to unwind a cancelled job."""


@dataclass(frozen=True)
class Param:
    """One typed, validated job parameter.

    ``kind`` is one of PARAM_KINDS; ``floats``/``ints`` are comma-separated
    lists (``length`` fixes how many). ``check`` is an extra rule returning an
    error message or None. ``minimum_exclusive`` makes ``minimum`` a strict bound
    (a learning rate must be > 0, not >= 0).
    """

    name: str
    kind: str
    default: Any
    help: str = ""
    minimum: float | None = None
    maximum: float | None = None
    minimum_exclusive: bool = False
    choices: tuple | None = None
    length: int | None = None
    check: Callable[[Any], str | None] | None = None
    applies_when: tuple[str, tuple] | None = None
    """(other param, its values): this one has an effect only while the other holds one of
    those values (momentum only with optimizer=momentum); forms hide it otherwise. None: always."""

    def __post_init__(self):
        if self.kind not in PARAM_KINDS:
            raise ValueError(f"param {self.name}: kind {self.kind!r} is not one of {PARAM_KINDS}")

    def applies(self, values: Mapping[str, Any]) -> bool:
        """Whether this param has an effect given the other params' ``values`` (typed or as typed)."""
        if self.applies_when is None:
            return True
        other, effective = self.applies_when
        return values.get(other) in effective

    def allowed(self) -> str:
        """A human description of what this param accepts."""
        if self.choices:
            return "one of " + ", ".join(str(choice) for choice in self.choices)
        noun = {
            "int": "an integer",
            "float": "a number",
            "bool": BOOL_SPELLINGS,
            "str": "text",
            "floats": "comma-separated numbers",
            "ints": "comma-separated integers",
        }[self.kind]
        if self.length:
            noun += f" ({self.length} of them)"
        bounds = []
        if self.minimum is not None:
            bounds.append(f"{'>' if self.minimum_exclusive else '>='} {_number_text(self.minimum)}")
        if self.maximum is not None:
            bounds.append(f"<= {_number_text(self.maximum)}")
        if bounds:
            noun += " " + " and ".join(bounds)
        return noun

    def parse(self, raw: Any) -> Any:
        """Convert text (or an already-typed value) and validate it."""
        value = self._convert(raw)
        self.validate(value)
        return value

    def _convert(self, raw: Any) -> Any:
        if isinstance(raw, str):
            text = raw.strip()
            if text == "" and self.kind != "str":
                raise ParamError(self.name, f"is empty; allowed: {self.allowed()}")
        else:
            text = None
        try:
            if self.kind == "int":
                if isinstance(raw, bool):
                    raise ValueError
                if text is not None:
                    return int(text, 10)
                if isinstance(raw, float) and not raw.is_integer():
                    raise ValueError
                return int(raw)
            if self.kind == "float":
                if isinstance(raw, bool):
                    raise ValueError
                return float(text) if text is not None else float(raw)
            if self.kind == "bool":
                if isinstance(raw, bool):
                    return raw
                word = (text if text is not None else str(raw)).lower()
                if word in TRUE_WORDS:
                    return True
                if word in FALSE_WORDS:
                    return False
                raise ValueError
            if self.kind == "str":
                return text if text is not None else str(raw)
            item_type = float if self.kind == "floats" else int
            items = text.split(",") if text is not None else list(raw)
            return tuple(item_type(str(item).strip()) for item in items)
        except (TypeError, ValueError, OverflowError):
            raise ParamError(self.name, f"{raw!r} is not {self.allowed()}") from None

    def validate(self, value: Any) -> None:
        """Raise ParamError unless ``value`` (already typed) is allowed."""
        items = value if self.kind in ("floats", "ints") else (value,)
        if self.kind in ("floats", "ints") and self.length is not None and len(items) != self.length:
            raise ParamError(self.name, f"needs {self.length} values, got {len(items)}")
        for item in items:
            if isinstance(item, float) and not math.isfinite(item):
                raise ParamError(self.name, f"{item!r} is not a finite number; allowed: {self.allowed()}")
            if self.choices and item not in self.choices:
                raise ParamError(self.name, f"{item!r} is not allowed; allowed: {self.allowed()}")
            if self.minimum is not None and isinstance(item, (int, float)) and not isinstance(item, bool):
                too_small = item <= self.minimum if self.minimum_exclusive else item < self.minimum
                if too_small:
                    raise ParamError(self.name, f"{_number_text(item)} is out of range; allowed: {self.allowed()}")
            if self.maximum is not None and isinstance(item, (int, float)) and not isinstance(item, bool):
                if item > self.maximum:
                    raise ParamError(self.name, f"{_number_text(item)} is out of range; allowed: {self.allowed()}")
        if self.check is not None:
            problem = self.check(value)
            if problem:
                raise ParamError(self.name, problem)

    def format(self, value: Any) -> str:
        """The text form of a value, as a user would type it back."""
        if self.kind in ("floats", "ints"):
            return ",".join(_number_text(item) for item in value)
        if self.kind == "bool":
            return "true" if value else "false"
        return str(value)


def _number_text(number: float) -> str:
    if isinstance(number, float) and number.is_integer() and abs(number) < 1e15:
        return str(int(number)) if abs(number) >= 1 or number == 0 else repr(number)
    return repr(number) if isinstance(number, float) else str(number)


@dataclass(frozen=True)
class JobSpec:
    """What a job is called, what it takes, and the function that runs it.

    ``check_params`` sees all typed params at once for rules across fields
    (raise ParamError). ``check_runtime`` runs once the runtime is known, still
    before the job starts (a device index must exist).
    """

    name: str
    title: str
    description: str
    params: tuple[Param, ...]
    run: Callable[[JobContext, dict], dict]
    key: str | None = None
    check_params: Callable[[dict], None] | None = None
    check_runtime: Callable[[dict, Any], None] | None = None
    name_params: tuple[str, ...] = ()
    """The params whose values tell this job's runs apart: a run is named ``train mnist mnist-cnn`` by them."""
    profiles_steps: bool = False
    """The job calls ``JobContext.profiler``'s step hooks (train): a profile request is answered with its next
    steps. Any other job's runner answers one with a failed answer (it has no training steps)."""
    run_jax: Callable[[JobContext, dict], dict] | str | None = None
    """The same job on JAX (the engine's runtime is a ``jax.sharding.Mesh``): same params, events and summary.
    Usually named as an entry point, ``"jobs.on_jax.matmul:run"``, imported when a run starts: the JAX runner
    imports the job's shared parts from the job's module, which only names it back (listing jobs imports no
    framework, and no module imports itself back). None: no JAX counterpart, and ``not_on_jax`` says why."""
    not_on_jax: str = ""
    """Why this job has no meaning on JAX (shown in its help and its form), when ``run_jax`` is None."""

    def frameworks(self) -> tuple[str, ...]:
        """The frameworks this job runs on: TensorFlow always, JAX when it has a JAX runner."""
        return ("tensorflow", "jax") if self.run_jax is not None else ("tensorflow",)

    def runner_for(self, framework: str) -> Callable[[JobContext, dict], dict]:
        """The function that runs this job on ``framework``; FrameworkNotSupported says why there is none."""
        if framework == "jax":
            if self.run_jax is None:
                raise FrameworkNotSupported(self.name, framework, self.not_on_jax)
            if isinstance(self.run_jax, str):
                return entry_point(self.run_jax)
            return self.run_jax
        if framework != "tensorflow":
            raise FrameworkNotSupported(self.name, framework, f"allowed: {', '.join(FRAMEWORKS)}")
        return self.run

    def param(self, name: str) -> Param:
        for param in self.params:
            if param.name == name:
                return param
        raise KeyError(name)

    def defaults(self) -> dict:
        return {param.name: param.default for param in self.params}

    def as_text(self, values: Mapping[str, Any]) -> dict[str, str]:
        """Every param as a user would type it: what crosses to the engine and back through ``resolve``."""
        return {param.name: param.format(values[param.name]) for param in self.params if param.name in values}

    def resolve(self, overrides: Mapping[str, Any] | None = None) -> dict:
        """Defaults updated by ``overrides`` (text or typed), all validated."""
        known = {param.name: param for param in self.params}
        values = self.defaults()
        for name, raw in (overrides or {}).items():
            if name not in known:
                allowed = ", ".join(known) or "none"
                raise ParamError(
                    name, f"unknown param for job {self.name!r}; allowed: {allowed}{did_you_mean(name, known)}"
                )
            values[name] = known[name].parse(raw)
        for param in self.params:
            param.validate(values[param.name])
        if self.check_params is not None:
            self.check_params(values)
        return values

    def describe(self) -> dict:
        """A JSON description for ``tpudash jobs --json`` and the TUI form."""
        return {
            "name": self.name,
            "title": self.title,
            "description": self.description,
            "key": self.key,
            "frameworks": list(self.frameworks()),
            "not_on_jax": self.not_on_jax or None,
            "params": [
                {
                    "name": param.name,
                    "kind": param.kind,
                    "default": param.format(param.default),
                    "help": param.help,
                    "allowed": param.allowed(),
                    "choices": list(param.choices) if param.choices else None,
                }
                for param in self.params
            ],
        }


def entry_point(reference: str) -> Callable[..., Any]:
    """The function ``"package.module:function"`` names, its module imported now."""
    module_name, _, function_name = reference.partition(":")
    return getattr(importlib.import_module(module_name), function_name)


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """``"; did you mean 'learning_rate'?"`` when ``word`` is a near miss of one of ``candidates``, else ``""``."""
    # Case is folded so "M" still points to "m"; the suggestion keeps the real spelling.
    by_folded = {candidate.casefold(): candidate for candidate in candidates}
    close = difflib.get_close_matches(word.casefold(), list(by_folded), n=1)
    return f"; did you mean {by_folded[close[0]]!r}?" if close else ""


LAUNCHED_FROM_COMMAND_LINE = "command line"
"""``tpudash run``: params are ``--set NAME=VALUE``."""
LAUNCHED_FROM_DASHBOARD = "dashboard"
"""A form of the dashboard (the engine): params are the form's fields."""


def param_advice(name: str, value: str, launched_from: str = LAUNCHED_FROM_COMMAND_LINE) -> str:
    """How a user sets param ``name`` to ``value`` where they launch runs, as advice ends a sentence."""
    if launched_from == LAUNCHED_FROM_DASHBOARD:
        return f"set the form's {name} field to {value}"
    return f"run with --set {name}={value}"


def parse_assignments(assignments: Sequence[str]) -> dict[str, str]:
    """``["lr=0.1", "steps=5"]`` → ``{"lr": "0.1", "steps": "5"}``."""
    parsed: dict[str, str] = {}
    for assignment in assignments:
        name, sep, value = assignment.partition("=")
        if not sep or not name.strip():
            raise ParamError(assignment or "--set", "expected NAME=VALUE")
        parsed[name.strip()] = value
    return parsed


@dataclass
class JobContext:
    """What a running job sees: the runtime, an emitter, cancel, its run dir.

    ``runtime`` is a ``tpudash.accel.description.Runtime`` (strategy, logical devices,
    description); jobs use it duck-typed so ``jobs`` stays independent of the
    shell around it. ``settings`` carries paths such as ``data_dir``.
    """

    runtime: Any
    emit: Callable[[Event], None]
    run_dir: Path
    cancel_event: threading.Event = field(default_factory=threading.Event)
    settings: Any = None
    kept_summary: dict = field(default_factory=dict)
    """What ``keep_summary`` was given last: the summary of the run if the job fails."""
    launched_from: str = LAUNCHED_FROM_COMMAND_LINE
    """Where the user launched the run: advice names what they can change there (a flag, or a form's field)."""
    profiler: Any = None
    """The run's profile responder (``tpudash.profiles.capture.ProfileResponder``, duck-typed: ``step_begin``,
    ``step_end``, ``marker``, ``schedule``), set by the engine's runner for a job that ``profiles_steps``;
    None: no one asks this run for profiles (a job run outside tpudash), and the job profiles on its own."""
    advisor: Any = None
    """The run's advice (``tpudash.advice.live.RunAdvisor``, duck-typed: ``start``, ``epoch_end``, ``finish``), set by
    the engine's runner for a job with training steps; None: no advice is kept (a job run outside tpudash)."""

    def advise_param(self, name: str, value: str) -> str:
        """How the user sets param ``name`` to ``value`` where they launched this run (``param_advice``)."""
        return param_advice(name, value, self.launched_from)

    def keep_summary(self, summary: dict) -> None:
        """Record ``summary`` with the run even if the job then fails.

        A job's return value is its summary when it succeeds; a check that
        finds a wrong device calls this with its results, then raises, so
        the failed run still says which device was wrong and by how much.
        """
        self.kept_summary = dict(summary)

    def replica_devices(self) -> list[str]:
        """The device of each replica, in replica order.

        Results that come out of a ``tf.function`` report the host as their
        device, so the strategy's own list is the truth; the logical devices
        are the fallback for a strategy that does not say.
        """
        strategy = self.runtime.strategy
        extended = getattr(strategy, "extended", None)  # a tf.distribute strategy; a JAX mesh has none
        devices = list(getattr(extended, "worker_devices", ()) or ())
        if extended is not None and len(devices) == strategy.num_replicas_in_sync:
            return devices
        return list(self.runtime.device_names)

    def cancelled(self) -> bool:
        return self.cancel_event.is_set()

    def raise_if_cancelled(self) -> None:
        if self.cancel_event.is_set():
            raise JobCancelled()

    def log(self, text: str, level: str = "info") -> None:
        self.emit(Log(level=level, text=text))

    def progress(self, done: int, total: int | None, unit: str) -> None:
        self.emit(Progress(done=done, total=total, unit=unit))
