"""The frameworks' profilers as the responder drives them: start, stop, the step marker and the input marker.

TensorFlow's ``tf.profiler.experimental`` and JAX's ``jax.profiler``, behind one
small interface (``FrameworkProfiler``; tests give a fake). The framework is
found the first time a marker or a profile needs it, by name: the process that
is profiled has loaded it already, and the dashboard and the CLI, which load
``tpudash.profiles`` but never profile, must never be seen to import it.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

from tpudash.profiles.requests import FRAMEWORKS

# The step marker's name: what XProf's overview reads steps from.
STEP_MARKER_NAME = "train"
# The input marker's name: XProf counts a host event inside a step as waiting for input only when it is a
# tf.data stage or named IteratorGetNext (xprof's xplane_to_step_events.cc, ClassifyCpuEvent); a Python data
# loader in a JAX loop is host compute to it unless its time is marked so.
INPUT_MARKER_NAME = "IteratorGetNext"


class FrameworkProfiler(Protocol):
    """A framework's in-process profiler and step marker (TensorFlow's, JAX's; a fake in tests)."""

    framework: str

    def start(self, logdir: str) -> None: ...

    def stop(self) -> None: ...

    def marker(self, step: int) -> AbstractContextManager[Any]: ...

    def input_marker(self) -> AbstractContextManager[Any]: ...

    def is_busy(self, error: BaseException) -> bool:
        """Whether ``error`` (from ``start``) says another profile is running in this process."""
        ...


class _FrameworkProfiler:
    """A framework's profiler, the framework found when first needed (``module``: ``tensorflow``, ``jax``)."""

    framework = ""
    module = ""

    def __init__(self) -> None:
        self._make_marker: Callable[[int], AbstractContextManager[Any]] | None = None
        self._make_input_marker: Callable[[], AbstractContextManager[Any]] | None = None

    def _framework(self) -> Any:
        # The process that is profiled has loaded its framework already (the run's backend says it is this one);
        # imported by name, not by an import statement: the dashboard and the CLI, which load this module but
        # never profile, must never be seen to import TensorFlow.
        return sys.modules.get(self.module) or importlib.import_module(self.module)

    def marker(self, step: int) -> AbstractContextManager[Any]:
        make = self._make_marker
        if make is None:
            try:
                make = self._marker_factory(self._framework())
            except (ImportError, AttributeError):  # no framework here: steps go unmarked, a profile says why
                make = _no_marker
            self._make_marker = make
        return make(step)

    def input_marker(self) -> AbstractContextManager[Any]:
        make = self._make_input_marker
        if make is None:
            try:
                make = self._input_marker_factory(self._framework())
            except (ImportError, AttributeError):  # no framework here: input goes unmarked
                make = contextlib.nullcontext
            self._make_input_marker = make
        return make()

    def _marker_factory(self, framework: Any) -> Callable[[int], AbstractContextManager[Any]]:
        raise NotImplementedError

    def _input_marker_factory(self, framework: Any) -> Callable[[], AbstractContextManager[Any]]:
        raise NotImplementedError


class TensorFlowProfiler(_FrameworkProfiler):
    """``tf.profiler.experimental``: start/stop, and ``Trace("train", step_num=n, _r=1)`` as the step marker."""

    framework = module = "tensorflow"

    def _marker_factory(self, tf: Any) -> Callable[[int], AbstractContextManager[Any]]:
        trace = tf.profiler.experimental.Trace
        return lambda step: trace(STEP_MARKER_NAME, step_num=step, _r=1)

    def _input_marker_factory(self, tf: Any) -> Callable[[], AbstractContextManager[Any]]:
        trace = tf.profiler.experimental.Trace
        return lambda: trace(INPUT_MARKER_NAME)

    def start(self, logdir: str) -> None:
        self._framework().profiler.experimental.start(logdir)

    def stop(self) -> None:
        self._framework().profiler.experimental.stop()

    def is_busy(self, error: BaseException) -> bool:
        return type(error).__name__ == "AlreadyExistsError"  # TensorFlow's error for a second start, without text


class JaxProfiler(_FrameworkProfiler):
    """``jax.profiler``: start_trace/stop_trace, and ``StepTraceAnnotation("train", step_num=n)`` as the marker."""

    framework = module = "jax"

    def _marker_factory(self, jax: Any) -> Callable[[int], AbstractContextManager[Any]]:
        annotation = jax.profiler.StepTraceAnnotation
        return lambda step: annotation(STEP_MARKER_NAME, step_num=step)

    def _input_marker_factory(self, jax: Any) -> Callable[[], AbstractContextManager[Any]]:
        annotation = jax.profiler.TraceAnnotation
        return lambda: annotation(INPUT_MARKER_NAME)

    def start(self, logdir: str) -> None:
        self._framework().profiler.start_trace(logdir)

    def stop(self) -> None:
        self._framework().profiler.stop_trace()

    def is_busy(self, error: BaseException) -> bool:
        return "already" in str(error).lower()  # "Profile has already been started. Only one profile may be run…"


def _no_marker(step: int) -> AbstractContextManager[Any]:
    return contextlib.nullcontext()


def framework_profiler(framework: str) -> FrameworkProfiler:
    """The profiler of ``framework`` (``tensorflow`` or ``jax``); ValueError for any other."""
    if framework == "tensorflow":
        return TensorFlowProfiler()
    if framework == "jax":
        return JaxProfiler()
    raise ValueError(f"framework: {framework!r} cannot be profiled; allowed: {', '.join(FRAMEWORKS)}")
