"""The recompile counters: Keras on TensorFlow retracing for another batch size, seen at the epoch's end.

The ``recompiles`` rule fires when a step function is traced again after the
first epoch's end, and stays quiet on fixed batches (a smaller last batch
does not retrace: Keras leaves the batch dimension undefined). The marks
carry the step they were seen at and the input signature traced for. The
watch's bookkeeping and JAX's explanation text are checked without a
framework; JAX itself is in tests/jax/test_advice_compiles_jax.py.
"""

from __future__ import annotations

import types
from typing import Any

import numpy as np

from tpudash.advice.compiles import (
    MARKS_PER_FUNCTION_PER_EPOCH,
    RecompileWatch,
    TfTraceCounter,
    explanation_cause,
    traced_functions,
)

EXAMPLES = 200


class StepCounter:
    """Stands in for a counter: totals and causes set by the test."""

    def __init__(self) -> None:
        self.totals: dict[str, int] = {}
        self.said: dict[str, list[str]] = {}
        self.why: str | None = None

    def counts(self) -> dict[str, int]:
        return dict(self.totals)

    def causes(self) -> dict[str, list[str]]:
        return {k: list(v) for k, v in self.said.items()}

    def not_counted(self) -> str | None:
        return self.why


def test_watch_marks_each_new_trace_at_its_epoch_end_and_fires_only_on_traces_after_the_first() -> None:
    counter = StepCounter()
    watch = RecompileWatch(counter)
    assert watch.advice().summary == "not checked: counted from the first epoch's end"
    counter.totals, counter.said = {"jit(step)": 1}, {"jit(step)": ["first trace"]}
    first = watch.epoch_end(0, 10)
    assert [(m.step, m.function, m.count, m.cause) for m in first] == [(10, "jit(step)", 1, "first trace")]
    assert watch.advice().state == "quiet"
    # an evaluation function first traced after the first epoch (validation_freq=2): its first trace, no recompile
    counter.totals["jit(evaluate)"] = 1
    assert [m.count for m in watch.epoch_end(1, 20)] == [1]
    assert watch.advice().state == "quiet"
    assert watch.epoch_end(2, 30) == []
    counter.totals["jit(step)"] = 2
    counter.said["jit(step)"].append("at x, now f32[16,4] and before f32[8,4]")
    (mark,) = watch.epoch_end(3, 40)
    assert (mark.step, mark.count, mark.cause) == (40, 2, "at x, now f32[16,4] and before f32[8,4]")
    advice = watch.advice()
    assert advice.state == "fires"
    assert advice.summary == ("jit(step) compiled 2 times: at x, now f32[16,4] and before f32[8,4]")
    assert advice.detail["counts"] == {"jit(step)": 2, "jit(evaluate)": 1}


def test_a_function_compiled_twice_in_the_first_epoch_fires_at_its_end() -> None:
    # Keras on JAX compiles its step again for a smaller last batch: on a TPU each compile takes its time.
    counter = StepCounter()
    watch = RecompileWatch(counter)
    counter.totals, counter.said = {"jit(step)": 2}, {"jit(step)": ["", "at x, now f32[8,4] and before f32[32,4]"]}
    watch.epoch_end(0, 10)
    advice = watch.advice()
    assert advice.state == "fires" and advice.summary.endswith("now f32[8,4] and before f32[32,4]")
    assert "drop_remainder=True" in advice.fix


def test_watch_caps_the_marks_of_a_function_recompiling_every_step() -> None:
    counter = StepCounter()
    watch = RecompileWatch(counter)
    counter.totals = {"jit(step)": 1}
    watch.epoch_end(0, 5)
    counter.totals = {"jit(step)": 501}
    marks = watch.epoch_end(1, 505)
    assert len(marks) == MARKS_PER_FUNCTION_PER_EPOCH
    assert [m.count for m in marks][:2] == [2, 3]
    assert "compiled 501 times" in watch.advice().summary


def test_watch_says_why_when_the_framework_gives_no_counts() -> None:
    counter = StepCounter()
    counter.why = "the model runs eagerly (run_eagerly=True): nothing is traced"
    watch = RecompileWatch(counter)
    watch.epoch_end(0, 1)
    assert watch.advice().state == "not checked"
    assert "run_eagerly=True" in watch.advice().summary


def test_jax_cache_miss_explanations_read_as_function_and_cause() -> None:
    # JAX 0.10.2's text (jax._src.interpreters.partial_eval.explain), as logged.
    changed = (
        "TRACING CACHE MISS at /tmp/loop.py:20 (<module>):\n  for f defined at /tmp/loop.py:15\n"
        "  all previously seen cache keys differ. For the closest previous key:\n  different input types:\n"
        "  * at x, now f32[16,4] and before f32[8,4]"
    )
    assert explanation_cause(changed) == ("f", "at x, now f32[16,4] and before f32[8,4]")
    first = "TRACING CACHE MISS at /tmp/loop.py:18 (<module>):\n  never seen function:\n    f id=1399 defined at /x:15"
    assert explanation_cause(first) == ("f", "first trace")
    assert explanation_cause("Finished tracing + transforming f for pjit in 0.01 sec") is None


# -- Keras on TensorFlow -------------------------------------------------------------------------------


def _model(runtime: Any, **compile_kwargs: Any) -> Any:
    import keras

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile("sgd", "mse", **compile_kwargs)
    return model


def _dataset() -> Any:
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.random((EXAMPLES, 4), dtype=np.float32)
    return tf.data.Dataset.from_tensor_slices((x, x[:, :2]))


def _epoch_watcher(watch: RecompileWatch) -> Any:
    """A Keras callback calling the watch at each epoch's end with the steps done so far."""
    import keras

    class Watcher(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.step = 0
            self.marks: dict[int, list[Any]] = {}
            self.states: dict[int, str] = {}

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.step += 1

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            self.marks[epoch] = watch.epoch_end(epoch, self.step)
            self.states[epoch] = watch.advice().state

    return Watcher()


def test_tf_fit_with_another_batch_size_after_the_first_epoch_fires_with_the_new_shape(runtime) -> None:
    from tpudash.callbacks import _GuardedStep

    # One tf.data dataset has one element_spec for a whole fit (batches concatenated from batch(32) and
    # batch(48) share the spec (None, 4): no retrace); a second fit with another fixed batch size retraces.
    model, ds = _model(runtime), _dataset()
    watch = RecompileWatch(TfTraceCounter(model))
    watcher = _epoch_watcher(watch)
    model.fit(ds.batch(32, drop_remainder=True), epochs=1, verbose=0, shuffle=False, callbacks=[watcher])
    # tpudash's callback wraps the step while it fits: the counter reads through the wrapper
    original = model.train_function
    model.train_function = _GuardedStep(original, types.SimpleNamespace(_profiler=lambda: None), "train_function")
    model.fit(
        ds.batch(48, drop_remainder=True), epochs=2, initial_epoch=1, verbose=0, shuffle=False, callbacks=[watcher]
    )

    assert traced_functions(original)["one_step_on_data"].experimental_get_tracing_count() == 2  # it did retrace
    assert watcher.states == {0: "quiet", 1: "fires"}
    assert {(m.function, m.count) for m in watcher.marks[0]} == {
        ("train.multi_step_on_iterator", 1),
        ("train.one_step_on_data", 1),
    }
    second = {m.function: m for m in watcher.marks[1]}
    steps = EXAMPLES // 32 + EXAMPLES // 48
    assert {(m.step, m.count) for m in second.values()} == {(steps, 2)}
    # Keras traces with reduce_retracing: the changed batch dimension is traced relaxed, as None
    relaxed = "now (float32[None,4], float32[None,2]), before (float32[32,4], float32[32,2])"
    assert second["train.one_step_on_data"].cause == relaxed
    assert second["train.multi_step_on_iterator"].cause == relaxed  # the iterator's batches
    advice = watch.advice()
    assert "compiled 2 times: now (float32[None,4]" in advice.summary
    assert advice.detail["counts"] == {"train.multi_step_on_iterator": 2, "train.one_step_on_data": 2}


def test_tf_fixed_batches_with_a_smaller_last_batch_stay_quiet(runtime) -> None:
    model = _model(runtime)
    watch = RecompileWatch(TfTraceCounter(model))
    watcher = _epoch_watcher(watch)
    model.fit(_dataset().batch(32), epochs=3, verbose=0, shuffle=False, callbacks=[watcher])  # 200 = 6 × 32 + 8

    assert watcher.states == {0: "quiet", 1: "quiet", 2: "quiet"}
    assert watcher.marks[1] == watcher.marks[2] == []
    assert watch.advice().summary == "each step function compiled once"


def test_tf_model_compiled_again_keeps_counting_its_new_step_functions_traces(runtime) -> None:
    model, ds = _model(runtime), _dataset().batch(50)
    watch = RecompileWatch(TfTraceCounter(model))
    watcher = _epoch_watcher(watch)
    model.fit(ds, epochs=1, verbose=0, shuffle=False, callbacks=[watcher])
    model.compile("adam", "mse")  # a new optimizer for fine-tuning: Keras makes (and traces) a new step
    model.fit(ds, epochs=2, initial_epoch=1, verbose=0, shuffle=False, callbacks=[watcher])

    assert watcher.states == {0: "quiet", 1: "fires"}
    (mark,) = [m for m in watcher.marks[1] if m.function == "train.one_step_on_data"]
    assert mark.count == 2
    assert mark.cause == "step function made anew (compile() again?), traced for (float32[None,4], float32[None,2])"


def test_tf_model_run_eagerly_is_not_checked_with_why(runtime) -> None:
    watch = RecompileWatch(TfTraceCounter(_model(runtime, run_eagerly=True)))
    watch.epoch_end(0, 1)
    assert watch.advice().summary == "not checked: the model runs eagerly (run_eagerly=True): nothing is traced"


def test_tf_counter_finds_nothing_before_fit_and_says_so(runtime) -> None:
    counter = TfTraceCounter(_model(runtime))
    assert counter.counts() == {}
    assert counter.not_counted() == "no train function made yet"
