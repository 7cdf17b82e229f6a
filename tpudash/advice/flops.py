"""FLOPs per training step, from the compiled step where the framework compiles it.

- JAX: ``jitted.lower(*args).compile().cost_analysis()["flops"]`` (a dict,
  or a list of one dict per program in older JAX): XLA's own count, every
  op (a multiply-add is 2 FLOPs, an elementwise op 1 per element). For a
  program partitioned over several devices XLA counts one device's share,
  so the count is scaled by the devices the step's inputs are laid out on.
- TensorFlow: TF 2.21 exposes no XLA cost analysis to Python, but it gives
  a ``jit_compile=True`` function's HLO
  (``experimental_get_compiler_ir(...)(stage="hlo")``, as lowered, before
  XLA's passes: 0.14 s for the CIFAR CNN where the optimized module takes
  0.9 s); ``hlo_matmul_flops`` counts its dot and convolution FLOPs as XLA's
  cost analysis does (2 per multiply-add, padding excluded), leaving out
  what the step's outputs do not depend on (XLA's dead-code pass drops it):
  the matrix unit's work, elementwise ops left out, equal to the optimized
  module's count. When XLA cannot compile the step, the
  graph's float-op count (``tf.compat.v1.profiler`` with
  ``ProfileOptionBuilder.float_operation()``) is used: TensorFlow's
  registered per-op formulas, which for a convolution's gradients assume
  the input's spatial size (an over-count for 'valid' convolutions).
- Keras on JAX: the same step lowered by JAX (``jax.jit(...).lower(...)``,
  never compiled or run) to HLO, counted by ``hlo_matmul_flops`` as above.
- Otherwise the count is None and ``source`` says why.

TensorFlow and JAX are imported inside the functions that need them.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FlopsCount:
    """FLOPs of one training step (all devices), or None; ``source`` says how they were counted, or why not."""

    flops: float | None
    source: str
    seconds: float = 0.0
    """What counting cost (lowering, compiling, reading the count)."""


# -- JAX ---------------------------------------------------------------------------------------------


def step_flops_jax(fn: Callable, *args: Any, **kwargs: Any) -> FlopsCount:
    """XLA's FLOPs for one call of ``fn(*args, **kwargs)`` (``fn`` jitted or not): compiles it, never runs it."""
    started = time.perf_counter()
    try:
        import jax

        jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
        compiled = jitted.lower(*args, **kwargs).compile()
        analysis = compiled.cost_analysis()
    except Exception as error:  # noqa: BLE001 - counting must never stop the user's training
        return FlopsCount(None, f"JAX could not compile the step: {type(error).__name__}: {error}")
    per_device = cost_analysis_flops(analysis)
    seconds = time.perf_counter() - started
    if per_device is None:
        return FlopsCount(None, f"XLA's cost analysis gave no FLOPs ({type(analysis).__name__})", seconds)
    devices = _partitions(jax, compiled)
    if devices > 1:
        source = f"XLA cost analysis of the compiled step: {per_device:,.0f} per device × {devices} devices"
    else:
        source = "XLA cost analysis of the compiled step"
    return FlopsCount(per_device * devices, source, seconds)


def step_flops_keras_jax(model: Any, batch_size: int) -> FlopsCount:
    """FLOPs of a Keras model's forward and backward pass on one batch of ``batch_size``, under JAX.

    What ``step_flops_keras_tf`` counts, the same way: the gradients of the
    mean square of the outputs through ``model.stateless_call`` in training
    mode, lowered (never run, never compiled) to XLA's HLO, whose dot and
    convolution FLOPs that reach the step's outputs are counted by
    ``hlo_matmul_flops`` (global shapes: the whole batch over every device).
    """
    started = time.perf_counter()
    try:
        import jax
        import jax.numpy as jnp

        inputs = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in _input_shapes(model, batch_size)]
        trainable = [variable.value for variable in model.trainable_variables]
        non_trainable = [variable.value for variable in model.non_trainable_variables]
    except Exception as error:  # noqa: BLE001 - a model whose inputs cannot be made: said, never raised
        return FlopsCount(None, f"no batch could be made for the model: {type(error).__name__}: {error}")

    def stand_in_loss(trainable: list, non_trainable: list, *batch: Any) -> Any:
        outputs, _ = model.stateless_call(
            trainable, non_trainable, batch if len(batch) > 1 else batch[0], training=True
        )
        return sum(jnp.mean(jnp.square(out.astype(jnp.float32))) for out in jax.tree_util.tree_leaves(outputs))

    try:
        hlo = jax.jit(jax.grad(stand_in_loss)).lower(trainable, non_trainable, *inputs).as_text(dialect="hlo")
        flops = hlo_matmul_flops(hlo)
    except Exception as error:  # noqa: BLE001 - counting must never stop the user's training
        return FlopsCount(
            None,
            f"JAX could not lower the step: {type(error).__name__}: {str(error)[:200]}",
            time.perf_counter() - started,
        )
    return FlopsCount(
        float(flops),
        f"XLA's HLO of the step (forward and backward, batch {batch_size}, lowered by JAX): its dot and convolution "
        "FLOPs that reach the step's outputs (elementwise ops and the optimizer's update not counted)",
        time.perf_counter() - started,
    )


def cost_analysis_flops(analysis: Any) -> float | None:
    """``analysis["flops"]``: a dict (JAX ≥ 0.4.30) or a list of dicts, one per program (summed)."""
    programs = analysis if isinstance(analysis, (list, tuple)) else [analysis]
    total, found = 0.0, False
    for program in programs:
        value = program.get("flops") if hasattr(program, "get") else None
        if isinstance(value, (int, float)) and math.isfinite(value) and value >= 0:
            total += float(value)
            found = True
    return total if found else None


def _partitions(jax: Any, compiled: Any) -> int:
    """The devices the compiled step is partitioned over (1 when that cannot be told)."""
    try:
        shardings = jax.tree_util.tree_leaves(compiled.input_shardings)
        return max((len(sharding.device_set) for sharding in shardings), default=1)
    except Exception:  # noqa: BLE001 - an older JAX without input_shardings: one device's count
        return 1


# -- TensorFlow --------------------------------------------------------------------------------------


def step_flops_keras_tf(model: Any, batch_size: int) -> FlopsCount:
    """FLOPs of a Keras model's forward and backward pass on one batch of ``batch_size``, under TensorFlow.

    Counted: the forward pass in training mode and the gradients of every
    trainable weight (what ``fit``'s step computes), for ``batch_size``
    examples; pass the global batch for the whole step over all replicas.
    The loss is stood in for by the mean square of the outputs (the
    backward pass through the layers is the same; the loss's few
    elementwise ops are not counted), and the optimizer's update (a few
    FLOPs per weight, not per example) is left out.
    """
    started = time.perf_counter()
    try:
        import tensorflow as tf

        inputs = _example_batch(tf, model, batch_size)
    except Exception as error:  # noqa: BLE001 - a model whose inputs cannot be made: said, never raised
        return FlopsCount(None, f"no batch could be made for the model: {type(error).__name__}: {error}")

    def forward_backward(*batch: Any) -> Any:
        with tf.GradientTape() as tape:
            outputs = model(batch if len(batch) > 1 else batch[0], training=True)
            loss = tf.add_n([tf.reduce_mean(tf.square(tf.cast(out, tf.float32))) for out in tf.nest.flatten(outputs)])
        return tape.gradient(loss, model.trainable_variables)

    xla_why = ""
    try:
        compiled = tf.function(forward_backward, jit_compile=True)
        hlo = compiled.experimental_get_compiler_ir(*inputs)(stage="hlo")
        flops = hlo_matmul_flops(hlo)
        return FlopsCount(
            float(flops),
            f"XLA's HLO of the step (forward and backward, batch {batch_size}): its dot and convolution FLOPs "
            "that reach the step's outputs (elementwise ops and the optimizer's update not counted)",
            time.perf_counter() - started,
        )
    except Exception as error:  # noqa: BLE001 - XLA cannot compile every model: the graph's count instead
        xla_why = f"XLA could not compile the step ({type(error).__name__}: {str(error)[:200]})"
    try:
        flops = _graph_float_ops(tf, forward_backward, inputs)
    except Exception as error:  # noqa: BLE001 - nothing left to count with
        return FlopsCount(
            None,
            f"{xla_why}; the graph's float ops could not be counted either: {type(error).__name__}: {error}",
            time.perf_counter() - started,
        )
    return FlopsCount(
        float(flops),
        f"the graph's float-op count (tf.compat.v1.profiler, forward and backward, batch {batch_size}), as "
        f"{xla_why}; a convolution's gradients are counted at its input's size",
        time.perf_counter() - started,
    )


def _example_batch(tf: Any, model: Any, batch_size: int) -> list:
    """Zeros shaped like the model's inputs with ``batch_size`` in front."""
    return [tf.zeros(list(shape), dtype=dtype) for shape, dtype in _input_shapes(model, batch_size)]


def _input_shapes(model: Any, batch_size: int) -> list[tuple[tuple[int, ...], str]]:
    """(shape with ``batch_size`` in front, dtype) of each of the model's inputs; ValueError says what is missing."""
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, not {batch_size!r}")
    specs = getattr(model, "inputs", None)
    if not specs:
        raise ValueError("the model has no known inputs (build it on an Input first)")
    shapes = []
    for spec in specs:
        shape = list(spec.shape)[1:]
        if any(dimension is None for dimension in shape):
            raise ValueError(f"input {getattr(spec, 'name', '?')} has an undefined dimension: {tuple(spec.shape)}")
        shapes.append(((batch_size, *shape), str(getattr(spec, "dtype", None) or "float32")))
    return shapes


def _graph_float_ops(tf: Any, forward_backward: Callable, inputs: list) -> int:
    concrete = tf.function(forward_backward).get_concrete_function(*inputs)
    options = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
    options["output"] = "none"
    profile = tf.compat.v1.profiler.profile(concrete.graph, options=options)
    return int(profile.total_float_ops)


# -- counting an HLO module's matrix work ------------------------------------------------------------

_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<shape>\(.*?\)|[a-z]\w*\[[^\]]*\](?:\{[^}]*\})?)\s+"
    r"(?P<op>[\w\-]+)\((?P<rest>.*)$"
)
_MATRIX_OP = re.compile(r"\s(?:dot|convolution)\(")
_ARRAY = re.compile(r"[a-z]\w*\[(?P<dims>[^\]]*)\]")


def hlo_matmul_flops(hlo_text: str) -> int:
    """The dot and convolution FLOPs of an HLO module's text (2 per multiply-add, as XLA's cost analysis).

    A convolution's multiply-adds are counted at the window positions that
    fall on the input, not on its padding, as XLA counts them; a loop's
    body is counted once, as XLA's cost analysis does.
    """
    shapes: dict[str, list[int]] = {}
    dead = _dead_in_entry(hlo_text)
    total = 0
    for line in hlo_text.splitlines():
        match = _INSTRUCTION.match(line)
        if match is None:
            if _MATRIX_OP.search(line):  # never a silent under-count: an unread product fails the count
                raise ValueError(f"cannot read the HLO line {line.strip()[:120]!r}")
            continue
        shape = _dims(match.group("shape"))
        if shape is not None:
            shapes[match.group("name")] = shape
        op = match.group("op")
        if op not in ("dot", "convolution") or match.group("name") in dead:
            continue
        operand_text, attributes = _until_closed(match.group("rest"))
        operands = [_operand_shape(text, shapes) for text in _split_operands(operand_text)]
        lhs, rhs = (operands + [None, None])[:2]
        if shape is None or len(operands) != 2 or lhs is None or rhs is None:
            raise ValueError(f"cannot read the shapes of {match.group('name')}")
        if op == "dot":
            total += _dot_flops(shape, lhs, attributes)
        else:
            total += _convolution_flops(shape, lhs, rhs, attributes)
    return total


def _dead_in_entry(hlo_text: str) -> set[str]:
    """The ENTRY computation's instructions its ROOT does not depend on.

    HLO as lowered from a TensorFlow graph, before XLA's passes, still holds
    what the graph computed and nothing reads (a gradient op's output for an
    input that needs none, such as the first convolution's input gradient);
    XLA's dead-code pass drops them before the step runs, so they are no FLOPs
    of the step. Reading the lowered HLO and dropping them here is several
    times cheaper than asking XLA for the optimized module.
    """
    operands: dict[str, list[str]] = {}
    root = None
    in_entry = False
    for line in hlo_text.splitlines():
        if line.startswith("ENTRY"):
            in_entry = True
            continue
        if not in_entry:
            continue
        if line.startswith("}"):
            break
        match = _INSTRUCTION.match(line)
        if match is None:
            continue
        name = match.group("name")
        operand_text, _ = _until_closed(match.group("rest"))
        # ``%x`` (TensorFlow's HLO text) or a bare ``x`` (JAX's), after an inline shape in older text.
        operands[name] = [part.split()[-1].lstrip("%") for part in _split_operands(operand_text)]
        if line.lstrip().startswith("ROOT"):
            root = name
    if root is None:
        return set()
    live, pending = set(), [root]
    while pending:
        name = pending.pop()
        if name not in live:
            live.add(name)
            pending.extend(operands.get(name, ()))
    return set(operands) - live


def _dims(shape_text: str) -> list[int] | None:
    if shape_text.startswith("("):
        return None  # a tuple: never an operand of a dot or a convolution
    match = _ARRAY.match(shape_text)
    if match is None:
        return None
    text = match.group("dims").strip()
    return [int(part.lstrip("<=")) for part in text.split(",")] if text else []


def _until_closed(text: str) -> tuple[str, str]:
    """The operands (up to the ``)`` that closes the call, layouts such as ``{1,0:T(8,128)}`` kept whole) and the rest."""
    depth = 0
    for index, character in enumerate(text):
        if character in "[{(":
            depth += 1
        elif character in "]})":
            if depth == 0:
                return text[:index], text[index + 1 :]
            depth -= 1
    return text, ""


def _split_operands(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for character in text:
        if character in "[{(":
            depth += 1
        elif character in "]})":
            depth -= 1
        if character == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += character
    if current.strip():
        parts.append(current.strip())
    return parts


def _operand_shape(text: str, shapes: dict[str, list[int]]) -> list[int] | None:
    """An operand's dims: inline (``f32[8,32]{1,0} %x``, older HLO text) or by its name (``%x``)."""
    inline = _ARRAY.match(text)
    if inline is not None:
        return _dims(inline.group(0))
    return shapes.get(text.split()[-1].lstrip("%"))


def _dot_flops(out: list[int], lhs: list[int], attributes: str) -> int:
    contracting = re.search(r"lhs_contracting_dims=\{([^}]*)\}", attributes)
    dims = [int(part) for part in contracting.group(1).split(",") if part.strip()] if contracting else []
    return 2 * math.prod(out) * math.prod(lhs[dim] for dim in dims)


def _convolution_flops(out: list[int], lhs: list[int], rhs: list[int], attributes: str) -> int:
    labels = re.search(r"dim_labels=([0-9a-z]+)_([0-9a-z]+)->([0-9a-z]+)", attributes)
    if labels is None:
        raise ValueError("a convolution without dim_labels")
    lhs_labels, rhs_labels, out_labels = labels.groups()
    spatial = len(lhs_labels) - 2
    window = _window(re.search(r"window=\{([^}]*)\}", attributes), spatial)
    # XLA's count: (input features / feature groups) × output features × (batch / batch groups) × the
    # valid window positions; the first is the kernel's input-feature dim, the third the output's batch.
    multiply_adds = out[out_labels.index("b")] * out[out_labels.index("f")] * rhs[rhs_labels.index("i")]
    for dim in range(spatial):
        label = str(dim)
        size, stride, pad_low, lhs_dilation, rhs_dilation = window[dim]
        multiply_adds *= _valid_pairs(
            lhs[lhs_labels.index(label)],
            out[out_labels.index(label)],
            size,
            stride,
            pad_low,
            lhs_dilation,
            rhs_dilation,
        )
    return 2 * multiply_adds


def _window(match: re.Match | None, spatial: int) -> list[tuple[int, int, int, int, int]]:
    """Per spatial dim: size, stride, low padding, lhs (input) dilation, rhs (window) dilation."""
    fields = {}
    if match is not None:
        for item in match.group(1).split():
            key, _, value = item.partition("=")
            fields[key] = value.split("x")
    result = []
    for dim in range(spatial):

        def field(key: str, default: str, dim: int = dim) -> str:
            values = fields.get(key)
            return values[dim] if values and dim < len(values) else default

        pad = field("pad", "0_0").split("_")
        result.append(
            (
                int(field("size", "1")),
                int(field("stride", "1")),
                int(pad[0]),
                int(field("lhs_dilate", "1")),
                int(field("rhs_dilate", "1")),
            )
        )
    return result


def _valid_pairs(
    size_in: int, size_out: int, window: int, stride: int, pad_low: int, lhs_dilation: int, rhs_dilation: int
) -> int:
    """How many (output position, window position) pairs read a real input element, not padding or a dilation hole."""
    dilated = (size_in - 1) * lhs_dilation + 1 if size_in else 0
    count = 0
    for window_index in range(window):
        offset = window_index * rhs_dilation - pad_low
        for position in range(size_out):
            at = position * stride + offset
            if 0 <= at < dilated and at % lhs_dilation == 0:
                count += 1
    return count
