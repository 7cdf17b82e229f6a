"""The advice result type and the rules that need no TensorFlow.

Every rule returns an ``Advice`` whose state is "fires", "quiet" or
"not checked" (with why in ``summary``): a rule is never silently absent.
Figures follow the TPU performance article among the sources: the matrix
unit works on 128x128 tiles and XLA pads one dimension to a multiple of 8
and another to a multiple of 128, so other sizes waste work.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

RULE_IDS = (
    "padding",
    "recompiles",
    "prefetch",
    "map-parallel",
    "cache",
    "shuffle-after-repeat",
    "interleave-parallel",
    "py-function",
    "input-bound",
    "small-batch",
    "mixed-precision",
)
STATES = ("fires", "quiet", "not checked")
SMALL_BATCH_PER_CORE = 128
INPUT_BOUND_PERCENT = 50.0


@dataclass(frozen=True)
class Advice:
    """One rule's verdict for one run: what a user reads and the line to change."""

    rule: str
    state: str
    summary: str
    fix: str = ""
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "state": self.state,
            "summary": self.summary,
            "fix": self.fix,
            "detail": dict(self.detail),
        }

    @classmethod
    def from_json(cls, data: Any) -> Advice:
        """Read back a stored verdict; untrusted input, so every field is checked."""
        if not isinstance(data, Mapping):
            raise ValueError("advice must be an object")
        rule, state = data.get("rule"), data.get("state")
        if rule not in RULE_IDS:
            raise ValueError(f"unknown rule {rule!r}")
        if state not in STATES:
            raise ValueError(f"unknown state {state!r}")
        summary, fix = data.get("summary", ""), data.get("fix", "")
        if not isinstance(summary, str) or not isinstance(fix, str):
            raise ValueError("summary and fix must be strings")
        detail = data.get("detail", {})
        if not isinstance(detail, Mapping) or not all(isinstance(k, str) for k in detail):
            raise ValueError("detail must be an object")
        return cls(str(rule), str(state), summary[:500], fix[:500], dict(detail))


def not_checked(rule: str, why: str) -> Advice:
    return Advice(rule, "not checked", f"not checked: {why}")


def _up(n: int, multiple: int) -> int:
    return max(multiple, math.ceil(n / multiple) * multiple)


def padding(shapes: Iterable[Sequence[int]], batch_per_core: int | None, on_tpu: bool) -> Advice:
    """Share of matrix-unit work wasted by padding, over the model's 2-D kernels.

    Each kernel (k, n) is a matmul of the (batch, k) activations: XLA pads the
    batch (second-minor of the activations) to 8, k (their minor) to 128 and n
    (the kernel's minor) to 128. Wasted = (padded MACs - real MACs) / padded.
    """
    kernels = [tuple(int(d) for d in s) for s in shapes if len(s) == 2]
    if not kernels:
        return not_checked("padding", "no 2-D weights seen")
    if not batch_per_core:
        return not_checked("padding", "batch per core unknown")
    b = int(batch_per_core)
    real = sum(b * k * n for k, n in kernels)
    padded = sum(_up(b, 8) * _up(k, 128) * _up(n, 128) for k, n in kernels)
    wasted = 100.0 * (padded - real) / padded
    odd = sorted({d for k, n in kernels for d in (k, n) if d % 128})
    detail = {"wasted_percent": round(wasted, 1), "batch_per_core": b, "dims_not_128": odd}
    batch_odd = b % 8 != 0
    if not odd and not batch_odd:
        return Advice("padding", "quiet", "model and batch sizes fill the matrix unit", detail=detail)
    verb = "wastes" if on_tpu else "would waste"
    where = ", ".join(str(d) for d in odd[:6]) or f"batch {b}"
    return Advice(
        "padding",
        "fires",
        f"{verb} {wasted:.0f} % of the matrix unit{'' if on_tpu else ' on a TPU'} (sizes {where} not multiples of 128)",
        "use layer widths that are multiples of 128 and a per-core batch that is a multiple of 8",
        detail,
    )


def small_batch(batch_per_core: int | None, on_tpu: bool) -> Advice:
    if not batch_per_core:
        return not_checked("small-batch", "batch per core unknown")
    detail = {"batch_per_core": int(batch_per_core)}
    if batch_per_core >= SMALL_BATCH_PER_CORE:
        return Advice("small-batch", "quiet", f"{batch_per_core} examples per core", detail=detail)
    text = "underfeeds each TPU core" if on_tpu else "would underfeed a TPU core"
    return Advice(
        "small-batch",
        "fires",
        f"{batch_per_core} examples per core {text} (< {SMALL_BATCH_PER_CORE})",
        f"dataset = dataset.batch({SMALL_BATCH_PER_CORE} * strategy.num_replicas_in_sync)",
        detail,
    )


def mixed_precision(policy: str | None, on_tpu: bool) -> Advice:
    if not on_tpu:
        return Advice("mixed-precision", "quiet", "not a TPU run: bfloat16 advice applies to TPUs")
    if not policy:
        return not_checked("mixed-precision", "dtype policy unknown")
    if "bfloat16" in policy or "float16" in policy:
        return Advice("mixed-precision", "quiet", f"dtype policy {policy}", detail={"policy": policy})
    return Advice(
        "mixed-precision",
        "fires",
        f"TPU run in {policy}: bfloat16 would halve memory traffic",
        "keras.mixed_precision.set_global_policy('mixed_bfloat16')  # keep the last layer float32",
        {"policy": policy},
    )


def input_bound(duty_hint: bool | None, input_percent: float | None) -> Advice:
    """From the duty-cycle hint and/or the last profile's input share."""
    if duty_hint is None and input_percent is None:
        return not_checked("input-bound", "no duty-cycle reading or profile yet")
    detail: dict[str, Any] = {}
    if input_percent is not None:
        detail["input_percent"] = round(float(input_percent), 1)
    fires = bool(duty_hint) or (input_percent is not None and input_percent >= INPUT_BOUND_PERCENT)
    if not fires:
        return Advice("input-bound", "quiet", "the accelerator is not waiting on input", detail=detail)
    why = (
        f"{input_percent:.0f} % of step time waits on input"
        if input_percent is not None and input_percent >= INPUT_BOUND_PERCENT
        else "accelerator idle between steps"
    )
    return Advice(
        "input-bound",
        "fires",
        f"input-bound: {why}",
        "dataset = dataset.map(f, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)",
        detail,
    )


def recompiles(
    recompiled: Mapping[str, int] | None,
    causes: Mapping[str, Sequence[str]] | None = None,
) -> Advice:
    """Fires when a step function was traced/compiled more than once, judged from the first epoch's end on.

    ``recompiled`` maps a function name to its traces/compiles past its first
    (``tpudash.advice.compiles.RecompileWatch.recompiled``); None when the framework does not say.
    """
    if recompiled is None:
        return not_checked("recompiles", "the framework does not report traces")
    hot = {name: n for name, n in recompiled.items() if n > 0}
    detail: dict[str, Any] = {"counts": {name: n + 1 for name, n in recompiled.items()}}
    if causes:
        detail["causes"] = {k: list(v)[:5] for k, v in causes.items() if k in hot}
    if not hot:
        return Advice("recompiles", "quiet", "each step function compiled once", detail=detail)
    worst = max(hot, key=lambda k: hot[k])
    cause = (causes or {}).get(worst)
    because = f": {cause[-1]}" if cause else ""
    return Advice(
        "recompiles",
        "fires",
        f"{worst} compiled {hot[worst] + 1} times{because}",
        "keep input shapes fixed (dataset.batch(n, drop_remainder=True); one batch size per model)",
        detail,
    )


def advise(found: Iterable[Advice]) -> list[Advice]:
    """Every rule id once, in RULE_IDS order; a missing rule reads "not checked"."""
    by_rule = {a.rule: a for a in found}
    return [by_rule.get(r) or not_checked(r, "nothing seen to judge") for r in RULE_IDS]
