"""A training step's events, emitted while the next step runs (``EventsBehind``).

Reporting a step (its running loss and accuracy, its progress) costs a few
hundred microseconds once the events are recorded to disk and drawn:
measured inside one training on two loaded cores, 0.46–0.85 ms of the
training thread a step, 1.7 % of a 52 ms step (``python -m tests.benchmarks
--only headless_cost``). On that thread the next step waits for all of it;
on a TPU, whose steps take a few milliseconds, that is a larger share.

Here a step's events go to one thread of their own, which emits them in order
while the training thread runs the next step (the framework's step leaves
Python's lock free for it). At that step's end, and before the training
thread emits anything itself, ``flush`` waits until what was handed over is
out, so the run's events keep exactly the order they had (a step's events
are at most one step late). Keras does the same with the
step-end hooks of callbacks on backends it deems thread-safe (``CallbackList``'s
asynchronous dispatch); on TensorFlow it calls them on the training thread, so
it is done here, after Keras has turned the step's logs into numbers.

Off the training thread the work still takes CPU: on a host whose cores the
framework's step keeps busy (two CPU cores training on eight logical
devices) it is taken from the step all the same, and the benchmark's figure
did not move; the training thread's own share fell to 0.16–0.19 ms a step.

A failure to emit (the record could not be written: ``RunNotWritable``) is
raised on the training thread at its next ``later`` or ``flush``, so the run
stops there, one step after it would have stopped before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

THREAD_NAME = "tpudash-step-events"


class EventsBehind:
    """Emits events handed over by one (training) thread, in order, on a thread of their own."""

    def __init__(self, emit: Callable[[Any], None]):
        self._emit = emit
        self._executor: ThreadPoolExecutor | None = None
        self._last: Future[None] | None = None
        self._error: Exception | None = None

    def later(self, events: Sequence[Any]) -> None:
        """Emit ``events`` in order on the events thread, after everything handed over before them."""
        self._raise_error()
        if self._executor is None:
            # One worker: what is handed over is emitted in the order it came. Started at the first step;
            # if close is never called, its thread ends when this object is collected (ThreadPoolExecutor's rule).
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=THREAD_NAME)
        self._last = self._executor.submit(self._emit_all, tuple(events))

    def flush(self) -> None:
        """Wait until everything handed over is emitted; raise here what emitting it raised."""
        self._wait()
        self._raise_error()

    def close(self) -> None:
        """Emit what is still pending and stop the events thread, however the training ended; never raises.

        A failure left here is the runner's to report (it keeps the first write error of the run).
        """
        self._wait()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def _wait(self) -> None:
        last, self._last = self._last, None
        if last is not None:
            last.result()  # _emit_all keeps its failure instead of raising it

    def _emit_all(self, events: tuple[Any, ...]) -> None:
        if self._error is not None:
            return  # the training thread is about to stop on it: nothing after a failed event
        try:
            for event in events:
                self._emit(event)
        except Exception as error:  # noqa: BLE001 - handed to the training thread, raised there
            self._error = error

    def _raise_error(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error
