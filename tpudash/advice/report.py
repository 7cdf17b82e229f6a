"""A run's advice as stored on the bus: ``<run>/advice.json``, replaced whole by the run's writer.

The writer (``tpudash.advice.live.RunAdvisor``, driven by the Keras callback,
``tpudash.record`` or the engine's train job) computes the static rules once
at the run's start and the live ones (recompiles, MFU) at every epoch's end,
and replaces this object each time. Readers (the run view's Advice panel and
header, ``tpudash advise``) read it through the run's ``RunFiles``, so a run in
a bucket reads the same as one on this host's disk.

The object is untrusted input (any process may write into a run): it is read
capped, and every field is checked; ``read_report`` raises ``ValueError``
naming what is wrong.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tpudash.advice.mfu import Mfu
from tpudash.advice.rules import Advice, advise
from tpudash.runs.backends import RunFiles

ADVICE_FILE = "advice.json"
MAX_ADVICE_BYTES = 256 * 1024
# Compile marks kept in the object: the first ones show what happened, and a function that recompiles every
# step would otherwise grow the file without bound.
MAX_COMPILE_MARKS = 200
MAX_MARK_TEXT = 300


@dataclass(frozen=True)
class CompileMark:
    """One trace (TensorFlow) or compilation (JAX) of a step function, where it fell on the run's axes."""

    step: int
    """The training step counted when it was seen (its epoch's end for TensorFlow's counters)."""
    time: float
    """Unix time it was seen."""
    function: str
    count: int
    """The function's traces/compiles so far, this one included."""
    cause: str = ""
    """Why, where the framework says (JAX's cache-miss explanation, the input signature TF traced for)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "time": self.time,
            "function": self.function,
            "count": self.count,
            "cause": self.cause,
        }

    @classmethod
    def from_json(cls, data: Any) -> CompileMark:
        if not isinstance(data, Mapping):
            raise ValueError("marks: each mark must be an object")
        step, count, when = data.get("step"), data.get("count"), data.get("time")
        for name, value in (("step", step), ("count", count)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"marks: {name} must be a whole number ≥ 0, not {value!r}")
        if isinstance(when, bool) or not isinstance(when, (int, float)) or not math.isfinite(when):
            raise ValueError(f"marks: time must be a unix time, not {when!r}")
        function, cause = data.get("function"), data.get("cause", "")
        if not isinstance(function, str) or not isinstance(cause, str):
            raise ValueError("marks: function and cause must be strings")
        return cls(int(step), float(when), function[:MAX_MARK_TEXT], int(count), cause[:MAX_MARK_TEXT])  # type: ignore[arg-type]


@dataclass(frozen=True)
class AdviceReport:
    """Every rule's verdict for one run, its MFU and its compile marks; what ``advice.json`` holds."""

    run_id: str
    advice: tuple[Advice, ...]
    """Every rule of ``rules.RULE_IDS`` once, in that order."""
    mfu: Mfu | None = None
    marks: tuple[CompileMark, ...] = ()
    framework: str = ""
    on_tpu: bool = False
    updated: float = field(default_factory=time.time)

    @classmethod
    def of(cls, run_id: str, found: list[Advice], **kwargs: Any) -> AdviceReport:
        """A report listing every rule, those not in ``found`` as "not checked"."""
        return cls(run_id, tuple(advise(found)), **kwargs)

    def firing(self) -> list[Advice]:
        return [a for a in self.advice if a.state == "fires"]

    def rule(self, rule: str) -> Advice:
        return next(a for a in self.advice if a.rule == rule)

    def hint(self) -> str | None:
        """The run header's one line while any rule fires (None when none does)."""
        firing = self.firing()
        if not firing:
            return None
        first = firing[0].summary
        more = f" (+{len(firing) - 1} more)" if len(firing) > 1 else ""
        return f"{first}{more}"

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "updated": self.updated,
            "framework": self.framework,
            "on_tpu": self.on_tpu,
            "advice": [a.to_json() for a in self.advice],
            "mfu": self.mfu.to_json() if self.mfu is not None else None,
            "marks": [m.to_json() for m in self.marks[:MAX_COMPILE_MARKS]],
        }

    @classmethod
    def from_json(cls, data: Any) -> AdviceReport:
        """Read back; untrusted input, so every field is checked (ValueError names the field)."""
        if not isinstance(data, Mapping):
            raise ValueError(f"{ADVICE_FILE} must hold an object")
        run_id, updated = data.get("run_id"), data.get("updated")
        if not isinstance(run_id, str) or not run_id:
            raise ValueError("run_id must be a non-empty string")
        if isinstance(updated, bool) or not isinstance(updated, (int, float)) or not math.isfinite(updated):
            raise ValueError(f"updated must be a unix time, not {updated!r}")
        framework, on_tpu = data.get("framework", ""), data.get("on_tpu", False)
        if not isinstance(framework, str) or not isinstance(on_tpu, bool):
            raise ValueError("framework must be a string and on_tpu true or false")
        items = data.get("advice")
        if not isinstance(items, list):
            raise ValueError("advice must be a list")
        found = [Advice.from_json(item) for item in items]
        marks = data.get("marks", [])
        if not isinstance(marks, list):
            raise ValueError("marks must be a list")
        mfu = data.get("mfu")
        return cls(
            run_id,
            tuple(advise(found)),
            Mfu.from_json(mfu) if mfu is not None else None,
            tuple(CompileMark.from_json(m) for m in marks[:MAX_COMPILE_MARKS]),
            framework[:40],
            on_tpu,
            float(updated),
        )


def write_report(files: RunFiles, report: AdviceReport) -> None:
    """Replace ``advice.json`` whole (``RunFiles.write`` replaces atomically on a disk, in one upload in a store)."""
    files.write(ADVICE_FILE, json.dumps(report.to_json(), default=str).encode())


def read_report(files: RunFiles) -> AdviceReport | None:
    """The run's advice, or None when it has none (yet); ValueError when it is unreadable, naming why."""
    try:
        data = files.read(ADVICE_FILE, MAX_ADVICE_BYTES)
    except FileNotFoundError:
        return None
    except OSError as error:  # too large, a link, the store away: said as the object being unreadable
        raise ValueError(f"{ADVICE_FILE}: unreadable ({error})") from None
    try:
        parsed = json.loads(data)
    except ValueError as error:
        raise ValueError(f"{ADVICE_FILE}: not JSON ({error})") from None
    try:
        return AdviceReport.from_json(parsed)
    except ValueError as error:
        raise ValueError(f"{ADVICE_FILE}: {error}") from None
