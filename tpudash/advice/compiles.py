"""Traces and compilations of a run's step functions, counted live: the ``recompiles`` rule's counters.

Two counters with one small surface (``counts``, ``causes``, ``not_counted``):

- ``TfTraceCounter(model)``: Keras 3 on TensorFlow. ``model.train_function``
  is a plain closure (``_make_function`` in Keras' TensorFlow trainer); the
  ``tf.function``s in its cells (``multi_step_on_iterator``, and
  ``one_step_on_data`` behind ``_autoconvert_optionals``' wrapper) carry
  ``experimental_get_tracing_count()``, about 1 µs a read. The cause of a trace
  is the input signature it was traced for, read from its concrete functions
  only when a count changed. Keras traces with ``reduce_retracing=True``: the
  second batch size is traced with the batch dimension relaxed (``None``),
  and no later size retraces.
- ``JaxCompileCounter()``: JAX's ``/jax/core/compile/backend_compile_duration``
  event, seen once per compilation with the function's name. The cause is
  JAX's own cache-miss explanation (``jax_explain_cache_misses``, e.g. "at x,
  now f32[16,4] and before f32[8,4]"), taken from its logger while a counter
  runs and kept off the user's console unless they had turned it on. JAX
  listeners cannot be removed in every version, so one process-wide listener
  dispatches to the counters running; it is removed where JAX allows when the
  last one stops, and the config and loggers are put back then.

``RecompileWatch(counter)`` turns either into what a run keeps: at each
epoch's end the new traces as ``CompileMark``s, and the ``recompiles`` rule
judged from what was traced again after the first epoch's end.

TensorFlow and JAX are imported inside functions only: importing this module
is free.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import types
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from tpudash.advice.report import MAX_MARK_TEXT, CompileMark
from tpudash.advice.rules import Advice, not_checked, recompiles

# A function recompiling at every step would otherwise give a mark (and a log line) per step.
MARKS_PER_FUNCTION_PER_EPOCH = 10
# Causes kept per function: the first ones say what happened.
CAUSES_KEPT = 50
KERAS_STEP_ATTRIBUTES = ("train_function", "test_function")
# How deep the closures of a Keras step function are walked for its tf.functions (the step, its wrapper, theirs).
CLOSURE_DEPTH = 3
JAX_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
JAX_EXPLAIN_LOGGER = "jax._src.interpreters.partial_eval"
# Records JAX logs at WARNING only because cache misses are explained (with a persistent compilation cache):
# kept off the console when the user had not asked for explanations.
JAX_EXPLAIN_SIDE_LOGGERS = {
    "jax._src.compiler": ("PERSISTENT COMPILATION CACHE MISS", "Not writing persistent cache entry"),
    "jax._src.compilation_cache": ("Not writing persistent cache entry",),
}
TRACING_MISS = "TRACING CACHE MISS"


class CompileCounter(Protocol):
    """What ``RecompileWatch`` reads: totals per function, their causes, and why there are none."""

    def counts(self) -> dict[str, int]: ...

    def causes(self) -> dict[str, list[str]]: ...

    def not_counted(self) -> str | None: ...


# -- TensorFlow ------------------------------------------------------------------------------------


class TfTraceCounter:
    """Traces of a Keras model's step ``tf.function``s (train, and test once made), read at call time.

    Names are ``train.<function>`` / ``test.<function>``. A step function made
    anew (``compile`` again, ``make_train_function(force=True)``) keeps the
    totals growing: the replaced functions' traces stay counted.
    """

    def __init__(self, model: Any) -> None:
        self.model = model
        self._seen: dict[str, tuple[Any, Any, dict[str, Any]]] = {}
        """attribute -> (the object last seen there, the step it wraps, that step's tf.functions by name)."""
        self._retired: dict[str, int] = {}
        self._retired_causes: dict[str, list[str]] = {}
        self._variants: dict[int, tuple[int, int]] = {}
        """id(function) -> (its tracing count, the distinct signatures it was traced for) when last read."""

    def _functions(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for attribute in KERAS_STEP_ATTRIBUTES:
            outer = getattr(self.model, attribute, None)
            seen = self._seen.get(attribute)
            if seen is not None and seen[0] is outer:  # the common case: a few attribute reads
                found.update(seen[2])
                continue
            step = unwrapped(outer)
            if seen is not None and seen[1] is step:  # wrapped anew (a callback's guard): the same functions
                functions = seen[2]
            else:
                if seen is not None:  # made anew: what the replaced functions traced stays counted
                    for name, function in seen[2].items():
                        self._retired[name] = self._retired.get(name, 0) + self._compiled(function)
                        self._retired_causes.setdefault(name, []).extend(dict.fromkeys(_signatures(function)))
                prefix = attribute.split("_")[0]
                functions = {f"{prefix}.{name}": fn for name, fn in traced_functions(step).items()}
            self._seen[attribute] = (outer, step, functions)
            found.update(functions)
        return found

    def counts(self) -> dict[str, int]:
        """Programs traced so far per function; cheap (a few attribute reads and ~1 µs per function)."""
        functions = self._functions()  # first: a step function made anew retires the old one's count here
        totals = dict(self._retired)
        for name, function in functions.items():
            totals[name] = totals.get(name, 0) + self._compiled(function)
        return totals

    def _compiled(self, function: Any) -> int:
        """Its distinct traced signatures: Keras traces a step twice for one signature with a tf.data input
        (measured: ``one_step_on_data`` 2 traces, 1 program); the signatures are read only when the count moved.
        """
        traces = _tracing_count(function)
        seen = self._variants.get(id(function))
        if seen is not None and seen[0] == traces:
            return seen[1]
        signatures = _signatures(function)
        variants = len(set(signatures)) if signatures else traces
        self._variants[id(function)] = (traces, variants)
        return variants

    def causes(self) -> dict[str, list[str]]:
        """Per function, one line per trace, in order: the input signature traced for and the one before.

        Reads the concrete functions (tens of µs): call it when a count changed.
        """
        out: dict[str, list[str]] = {}
        current = self._functions()
        names = set(self._retired_causes) | set(current)
        for name in names:
            signatures = list(self._retired_causes.get(name, []))
            remade = len(signatures)  # where the step function made anew starts
            if name in current:
                signatures.extend(dict.fromkeys(_signatures(current[name])))  # one line per program, as counted
            out[name] = [
                f"traced for {sig}"
                if k == 0
                else f"step function made anew (compile() again?), traced for {sig}"
                if k == remade
                else f"now {sig}, before {signatures[k - 1]}"
                for k, sig in enumerate(signatures[:CAUSES_KEPT])
            ]
        return out

    def not_counted(self) -> str | None:
        if getattr(self.model, "run_eagerly", False):
            return "the model runs eagerly (run_eagerly=True): nothing is traced"
        if getattr(self.model, "train_function", None) is None:
            return "no train function made yet"
        if not self._functions():
            return "no tf.function found in the model's train function"
        return None


def unwrapped(step: Any) -> Any:
    """A step function without the wrappers put around it (tpudash's ``_GuardedStep`` holds it in ``.wrapped``)."""
    for _ in range(4):
        if _is_tf_function(step) or not hasattr(step, "wrapped"):
            break
        step = step.wrapped
    return step


def traced_functions(step: Any) -> dict[str, Any]:
    """The ``tf.function``s a Keras step function calls, by name, found in its closure cells.

    The step itself when it is one (tf.keras); else its cells and those of the
    plain functions in them (``_autoconvert_optionals``' wrapper), a few levels
    deep. Other objects in the cells (the model) are not walked.
    """
    step = unwrapped(step)
    if step is None:
        return {}
    if _is_tf_function(step):
        return {_function_name(step): step}
    found: dict[str, Any] = {}
    stack: list[tuple[Any, int]] = [(step, 0)]
    visited: set[int] = set()
    while stack:
        function, depth = stack.pop()
        if id(function) in visited:
            continue
        visited.add(id(function))
        inner = [getattr(function, "__wrapped__", None)]
        for cell in getattr(function, "__closure__", None) or ():
            try:
                inner.append(cell.cell_contents)
            except ValueError:  # a cell not yet filled
                continue
        for value in inner:
            if _is_tf_function(value):
                found.setdefault(_function_name(value), value)
            elif isinstance(value, types.FunctionType) and depth < CLOSURE_DEPTH:
                stack.append((value, depth + 1))
    return found


def _is_tf_function(value: Any) -> bool:
    return callable(getattr(value, "experimental_get_tracing_count", None))


def _function_name(function: Any) -> str:
    return str(getattr(function, "name", None) or getattr(function, "__name__", "tf.function"))


def _tracing_count(function: Any) -> int:
    return int(function.experimental_get_tracing_count())


def _signatures(function: Any) -> list[str]:
    """The input signatures a tf.function was traced for, in the order traced ("float32[None,4], float32[None,2]")."""
    lister = getattr(function, "_list_all_concrete_functions", None)  # TF has no public listing
    if lister is None or _tracing_count(function) == 0:  # never list an untraced one: that could trace it
        return []
    try:
        concrete = list(lister())
    except Exception:  # noqa: BLE001 - a TF without it: the count stands, the cause is not said
        return []
    return [signature_text(getattr(c, "structured_input_signature", None)) for c in concrete]


def signature_text(signature: Any) -> str:
    """A traced input signature as shapes: an iterator's by its elements, one ``dtype[dims]`` per tensor."""
    import tensorflow as tf

    parts: list[str] = []

    def add(spec: Any) -> None:
        element = getattr(spec, "element_spec", None) or getattr(spec, "_element_spec", None)
        if element is not None:  # an iterator (plain or distributed): the batches it yields
            for leaf in tf.nest.flatten(element):
                add(leaf)
        elif isinstance(spec, tf.TensorSpec):
            dims = ",".join("None" if d is None else str(d) for d in spec.shape.as_list() or [])
            parts.append(f"{spec.dtype.name}[{dims}]")
        elif isinstance(spec, tf.TypeSpec):
            for leaf in tf.nest.flatten(spec, expand_composites=True):
                if isinstance(leaf, tf.TensorSpec):
                    add(leaf)
        elif spec is not None:
            parts.append(repr(spec)[:40])

    def walk(value: Any) -> None:  # by hand: tf.nest would open an iterator's spec into its resource handle
        if isinstance(value, (tuple, list)):
            for item in value:
                walk(item)
        elif isinstance(value, Mapping):
            for item in value.values():
                walk(item)
        else:
            add(value)

    walk(signature)
    runs: list[list[Any]] = []  # a mirrored step's per-replica inputs: "float32[4,4] ×8", not eight of them
    for part in parts:
        if runs and runs[-1][0] == part:
            runs[-1][1] += 1
        else:
            runs.append([part, 1])
    text = ", ".join(part if n == 1 else f"{part} ×{n}" for part, n in runs)
    return f"({text})"[:MAX_MARK_TEXT]


# -- JAX ---------------------------------------------------------------------------------------------


class JaxCompileCounter:
    """Compilations of the user's jitted functions while started (``start``/``stop``, or ``with``); thread-safe.

    Counted: functions JAX explains tracing-cache misses for, i.e. defined
    outside JAX and the standard library (the user's, Keras' trainer's), and
    any named in ``functions`` (as JAX names them, e.g. "f" for ``jit(f)``);
    JAX's own eager operations (``jit(broadcast_in_dim)``…) are not. Names are
    JAX's (``jit(f)``).
    """

    def __init__(self, functions: tuple[str, ...] = ()) -> None:
        self.functions = frozenset(functions)
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._causes: dict[str, list[str]] = {}
        self._running = False
        self._started = False

    def start(self) -> JaxCompileCounter:
        if not self._running:
            _HUB.attach(self)
            self._running = self._started = True
        return self

    def stop(self) -> None:
        if self._running:
            self._running = False
            _HUB.detach(self)

    def __enter__(self) -> JaxCompileCounter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def causes(self) -> dict[str, list[str]]:
        with self._lock:
            return {name: list(causes) for name, causes in self._causes.items()}

    def not_counted(self) -> str | None:
        """Why there are no counts: never started (once stopped, what it counted stands)."""
        return None if self._started else "JAX's compilations were not counted (the counter was never started)"

    def _compiled(self, name: str, bare: str, cause: str, user_function: bool) -> None:
        if not (user_function or bare in self.functions):
            return
        with self._lock:
            self._counts[name] = self._counts.get(name, 0) + 1
            causes = self._causes.setdefault(name, [])
            if len(causes) < CAUSES_KEPT:
                causes.append(cause)


def bare_name(fun_name: str) -> str:
    """``jit(f)`` -> ``f``: the name JAX's explanations use."""
    match = re.fullmatch(r"\w+\((.*)\)", fun_name)
    return match.group(1) if match else fun_name


def explanation_cause(message: str) -> tuple[str, str] | None:
    """(function, cause) of JAX's "TRACING CACHE MISS" text; None for another message.

    The cause is its diff lines ("at x, now f32[16,4] and before f32[8,4]"),
    or "first trace" for a function JAX had never seen.
    """
    if not message.startswith(TRACING_MISS):
        return None
    lines = [line.strip() for line in message.splitlines()[1:]]
    if lines and lines[0].startswith("never seen function"):
        name = lines[1].split(" id=")[0].strip() if len(lines) > 1 else ""
        return name, "first trace"
    head = next((line for line in lines if line.startswith("for ")), "")
    name = head[4:].split(" defined at ")[0].strip()
    diffs = [line[2:] for line in lines if line.startswith("* ")]
    if diffs:
        return name, "; ".join(diffs)[:MAX_MARK_TEXT]
    after = lines[lines.index(head) + 2 :] if head in lines else []  # past "all previously seen cache keys differ"
    return name, " ".join(after)[:MAX_MARK_TEXT] or "cache miss not explained"


class _JaxHub:
    """The one JAX listener of this process and the explanation capture, shared by every running counter."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counters: list[JaxCompileCounter] = []
        self.registered = False
        self.user_functions: set[str] = set()
        self.pending: dict[int, dict[str, str]] = {}
        """Per thread: explanations logged while tracing, waiting for that function's compile."""
        self.user_explains = False
        self._undo: list[Callable[[], None]] = []

    def attach(self, counter: JaxCompileCounter) -> None:
        with self.lock:
            if not self.counters:
                self._install()
            self.counters.append(counter)

    def detach(self, counter: JaxCompileCounter) -> None:
        with self.lock:
            if counter in self.counters:
                self.counters.remove(counter)
            if not self.counters:
                self._uninstall()

    def _install(self) -> None:
        import jax

        monitoring = jax.monitoring
        if not self.registered:
            monitoring.register_event_duration_secs_listener(self.on_duration)
            self.registered = True
        if hasattr(monitoring, "unregister_event_duration_listener"):

            def unregister() -> None:
                monitoring.unregister_event_duration_listener(self.on_duration)
                self.registered = False

            self._undo.append(unregister)
        explains = bool(jax.config.jax_explain_cache_misses)
        self.user_explains = explains
        if not explains:
            jax.config.update("jax_explain_cache_misses", True)
            self._undo.append(lambda: jax.config.update("jax_explain_cache_misses", False))
        capture = _ExplanationFilter(self)
        explain_logger = logging.getLogger(JAX_EXPLAIN_LOGGER)
        explain_logger.addFilter(capture)
        self._undo.append(lambda: explain_logger.removeFilter(capture))
        if not explain_logger.isEnabledFor(logging.WARNING):  # explanations are logged at WARNING
            level = explain_logger.level
            explain_logger.setLevel(logging.WARNING)
            self._undo.append(lambda: explain_logger.setLevel(level))
        if not explains:
            for name, prefixes in JAX_EXPLAIN_SIDE_LOGGERS.items():
                side, quiet = logging.getLogger(name), _DropFilter(prefixes)
                side.addFilter(quiet)
                self._undo.append(lambda side=side, quiet=quiet: side.removeFilter(quiet))  # type: ignore[misc]

    def _uninstall(self) -> None:
        undo, self._undo = self._undo, []
        for step in reversed(undo):
            step()
        self.pending.clear()

    def explained(self, name: str, cause: str) -> None:
        with self.lock:
            self.user_functions.add(name)
            self.pending.setdefault(threading.get_ident(), {})[name] = cause

    def on_duration(self, event: str, duration_secs: float, **kwargs: Any) -> None:
        if event != JAX_COMPILE_EVENT:
            return
        fun_name = str(kwargs.get("fun_name") or "?")
        bare = bare_name(fun_name)
        with self.lock:
            waiting = self.pending.pop(threading.get_ident(), {})
            cause = waiting.get(bare, "")
            user_function = bare in self.user_functions
            counters = list(self.counters)
        for counter in counters:
            counter._compiled(fun_name, bare, cause, user_function)


class _ExplanationFilter(logging.Filter):
    """Takes JAX's cache-miss explanations as causes; drops them unless the user had asked for them."""

    def __init__(self, hub: _JaxHub) -> None:
        super().__init__()
        self.hub = hub

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            found = explanation_cause(record.getMessage())
        except Exception:  # noqa: BLE001 - a message this cannot read is left to JAX's logging
            return True
        if found is None:
            return True
        self.hub.explained(*found)
        return self.hub.user_explains


class _DropFilter(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.WARNING and str(record.msg).startswith(self.prefixes))


_HUB = _JaxHub()


# -- the watch ---------------------------------------------------------------------------------------


class RecompileWatch:
    """A counter read at each epoch's end: the new traces as marks, and the ``recompiles`` rule.

    The first ``epoch_end`` sets the baseline: a function traced again after
    it (its total then > 1) is a recompile; the first epoch's traces are not.
    """

    def __init__(self, counter: CompileCounter) -> None:
        self.counter = counter
        self._last: dict[str, int] = {}
        self._baseline: dict[str, int] | None = None
        self._causes: dict[str, list[str]] = {}

    def epoch_end(self, epoch: int, step: int) -> list[CompileMark]:
        """The traces/compiles since the last call, each a mark at ``step``; the first call is the baseline."""
        marks = self.poll(step)
        if self._baseline is None:
            self._baseline = dict(self._last)
        return marks

    def poll(self, step: int) -> list[CompileMark]:
        """The traces/compiles since the last call, as marks at ``step``; reads causes only when a count moved."""
        counts = self.counter.counts()
        moved = {name: n for name, n in counts.items() if n > self._last.get(name, 0)}
        if not moved:
            return []
        causes = self.counter.causes()
        now = time.time()
        marks: list[CompileMark] = []
        for name, count in moved.items():
            said = causes.get(name, [])
            self._causes[name] = said
            first = self._last.get(name, 0) + 1
            for n in range(first, min(count, first + MARKS_PER_FUNCTION_PER_EPOCH - 1) + 1):
                marks.append(CompileMark(step, now, name, n, _cause_of(said, n)))
            self._last[name] = count
        return marks

    def recompiled(self) -> dict[str, int] | None:
        """Per function, its traces/compiles past its first; None before the first epoch's end (still warming up).

        A TensorFlow function's count is since Keras made it (a second ``fit`` of the model with another batch
        size retraces it: counted); a JAX one's since the counter started.
        """
        if self._baseline is None:
            return None
        return {name: max(0, n - 1) for name, n in self._last.items()}

    def advice(self) -> Advice:
        why = self.counter.not_counted()
        if why is not None:
            return not_checked("recompiles", why)
        after = self.recompiled()
        if after is None:
            return not_checked("recompiles", "counted from the first epoch's end")
        causes: Mapping[str, list[str]] = {
            name: self._causes.get(name, [])[self._last[name] - n :] for name, n in after.items() if n
        }
        return recompiles(after, {name: [c for c in said if c] for name, said in causes.items()})


def _cause_of(causes: list[str], count: int) -> str:
    """The cause of a function's ``count``-th trace: its own line, else the newest said."""
    if 0 < count <= len(causes):
        return causes[count - 1]
    return causes[-1] if causes else ""
