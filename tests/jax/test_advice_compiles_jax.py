"""JAX's compilations counted live: a jitted step called with new shapes after the first epoch, and Keras on JAX.

The ``recompiles`` rule fires with JAX's own cache-miss explanation as the
cause ("at x, now f32[16,4] and before f32[8,4]"), stays quiet on fixed
shapes, and does not count JAX's eager operations. While counting, the
explanations are kept off the user's logs; stopping puts JAX's config, its
loggers and its listeners back as they were.
"""

from __future__ import annotations

import logging
import threading

import numpy as np

from tpudash.advice.compiles import JAX_EXPLAIN_LOGGER, JaxCompileCounter, RecompileWatch


def _step():
    import jax

    @jax.jit
    def step(x, w):
        return (x @ w).sum()

    return step


def test_jitted_function_called_with_new_shapes_after_the_first_epoch_fires_with_jax_explanation() -> None:
    import jax.numpy as jnp

    step, w = _step(), jnp.ones((4, 3))
    with JaxCompileCounter() as counter:
        watch = RecompileWatch(counter)
        for _ in range(3):  # the first epoch: one compile
            step(jnp.ones((8, 4)), w)
        (first,) = watch.epoch_end(0, 3)
        assert (first.function, first.count, first.cause) == ("jit(step)", 1, "first trace")
        for _ in range(3):  # the second: a new batch size
            step(jnp.ones((16, 4)), w)
        (mark,) = watch.epoch_end(1, 6)
    assert (mark.step, mark.function, mark.count) == (6, "jit(step)", 2)
    assert mark.cause == "at x, now f32[16,4] and before f32[8,4]"
    advice = watch.advice()
    assert advice.state == "fires"
    assert advice.summary == "jit(step) compiled 2 times: at x, now f32[16,4] and before f32[8,4]"


def test_fixed_shapes_stay_quiet_and_jax_eager_operations_are_not_counted() -> None:
    import jax.numpy as jnp

    step, w = _step(), jnp.ones((4, 3))
    with JaxCompileCounter() as counter:
        watch = RecompileWatch(counter)
        for epoch in range(3):
            for size in range(2, 5):
                step(jnp.ones((8, 4)), w)
                jnp.zeros((size + 10 * epoch, size)) + 1  # eager ops compiling for new shapes: JAX's, not the user's
            watch.epoch_end(epoch, 3 * (epoch + 1))
        assert counter.counts() == {"jit(step)": 1}
    assert watch.advice().state == "quiet"
    assert watch.advice().summary == "each step function compiled once"


def test_compiles_on_another_thread_are_counted_and_each_running_counter_sees_them() -> None:
    import jax.numpy as jnp

    step, w = _step(), jnp.ones((4, 3))
    first, second = JaxCompileCounter().start(), JaxCompileCounter().start()
    try:
        worker = threading.Thread(target=lambda: [step(jnp.ones((n, 4)), w) for n in (2, 3)])
        worker.start()
        worker.join()
        second.stop()
        step(jnp.ones((5, 4)), w)
    finally:
        first.stop()
        second.stop()
    assert first.counts() == {"jit(step)": 3}
    assert first.causes()["jit(step)"][1] == "at x, now f32[3,4] and before f32[2,4]"
    assert second.counts() == {"jit(step)": 2}


def test_counting_keeps_the_explanations_off_the_logs_and_stopping_restores_jax(caplog) -> None:
    import jax
    import jax.numpy as jnp
    from jax._src import monitoring

    listeners = len(monitoring.get_event_duration_listeners())
    step, w = _step(), jnp.ones((4, 3))
    with caplog.at_level(logging.DEBUG, logger="jax"), JaxCompileCounter() as counter:
        step(jnp.ones((2, 4)), w)
        step(jnp.ones((3, 4)), w)
    assert counter.counts() == {"jit(step)": 2}
    assert not [r for r in caplog.records if "TRACING CACHE MISS" in r.getMessage()]
    assert jax.config.jax_explain_cache_misses is False
    assert logging.getLogger(JAX_EXPLAIN_LOGGER).filters == []
    assert len(monitoring.get_event_duration_listeners()) == listeners

    # a user who asked for explanations keeps them, and their setting
    jax.config.update("jax_explain_cache_misses", True)
    try:
        with caplog.at_level(logging.WARNING, logger=JAX_EXPLAIN_LOGGER), JaxCompileCounter() as counter:
            step(jnp.ones((6, 4)), w)
        assert counter.causes() == {"jit(step)": ["at x, now f32[6,4] and before f32[2,4]"]}
        assert [r for r in caplog.records if "now f32[6,4]" in r.getMessage()]
        assert jax.config.jax_explain_cache_misses is True
    finally:
        jax.config.update("jax_explain_cache_misses", False)


def test_keras_on_jax_fit_with_another_batch_size_is_seen_with_jax_explanation() -> None:
    import keras

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile("sgd", "mse")
    x = np.random.default_rng(0).random((192, 4), dtype=np.float32)
    with JaxCompileCounter() as counter:
        watch = RecompileWatch(counter)
        marks: dict[int, list] = {}
        states: dict[int, str] = {}

        class Watcher(keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                marks[epoch] = watch.epoch_end(epoch, epoch + 1)
                states[epoch] = watch.advice().state

        model.fit(x, x[:, :2], batch_size=32, epochs=2, verbose=0, shuffle=False, callbacks=[Watcher()])
        model.fit(x, x[:, :2], batch_size=48, epochs=3, initial_epoch=2, verbose=0, callbacks=[Watcher()])
    assert states == {0: "quiet", 1: "quiet", 2: "fires"}
    assert [(m.function, m.count) for m in marks[0]] == [("jit(train_step)", 1)]
    assert marks[1] == []
    (mark,) = marks[2]
    assert (mark.function, mark.count) == ("jit(train_step)", 2)
    assert "now f32[48,4] and before f32[32,4]" in mark.cause
    assert "jit(train_step) compiled 2 times: at data[0], now f32[48,4]" in watch.advice().summary


def test_a_counter_never_started_is_not_checked_with_why() -> None:
    watch = RecompileWatch(JaxCompileCounter())
    watch.epoch_end(0, 1)
    assert watch.advice().summary == "not checked: JAX's compilations were not counted (the counter was never started)"
