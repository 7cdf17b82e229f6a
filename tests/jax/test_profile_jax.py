"""Profiles of JAX training, asked for over the bus while it trains: a plain loop, and Keras on JAX.

The loop recorded with ``tpudash.record`` marks its steps with ``run.step(n)``
(JAX's ``StepTraceAnnotation``); Keras's fit on JAX is marked by
``TpudashCallback`` with the same. The test asks with ``request_profile`` as
the dashboard does and waits for the answer file. The capture lands where
XProf looks, with the step markers in it.
"""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np

import tpudash
from jobs.events import Log, RunFinished
from tests.profile_loops import profile_recorded_loop
from tpudash.profiles.requests import read_answer, request_profile, wait_for_answer
from tpudash.runs.store import RunStore


def test_a_profile_asked_of_a_jax_loop_lands_where_xprof_looks(tmp_path, monkeypatch):
    monkeypatch.setattr("tpudash.recording.PROFILE_POLL_SECONDS", 0.02)  # the run looks often: a short test
    runs_dir = tmp_path / "runs"
    store = RunStore(runs_dir)

    @jax.jit
    def train_step(weights, batch):
        loss, gradient = jax.value_and_grad(lambda w: jnp.mean((batch @ w) ** 2))(weights)
        return weights - 0.01 * gradient, loss

    weights = [jnp.ones((64, 8))]
    batch = jnp.ones((32, 64))

    def step_body(run: tpudash.recording.RecordedRun, step: int) -> None:
        weights[0], loss = train_step(weights[0], batch)
        loss.block_until_ready()
        run.metric("loss", loss, step=step)

    profiled = profile_recorded_loop(runs_dir, "jax-loop", step_body, steps=4)
    run, files, request, answer = profiled.run, profiled.files, profiled.request, profiled.answer
    assert run.profiler is not None and run.profiler.framework == "jax"
    assert answer is not None and answer.state == "done", answer
    assert answer.framework == "jax" and answer.last_step - answer.first_step == 3
    xplane = runs_dir / run.run_id / "profile" / "plugins" / "profile" / answer.capture / f"{answer.host}.xplane.pb"
    assert xplane.is_file()
    assert b"step_num" in xplane.read_bytes()  # the step markers XProf's overview reads steps from

    data = store.load(run.run_id)
    assert data.info.status == "done" and not data.problems
    assert [event.status for _, event in data.events if isinstance(event, RunFinished)] == ["done"]
    assert any("profile of steps" in event.text for _, event in data.events if isinstance(event, Log))
    assert read_answer(files, request.id).state == "done"


def test_a_loop_that_only_reports_progress_is_profiled_too(tmp_path):
    runs_dir = tmp_path / "runs"
    store = RunStore(runs_dir)
    with tpudash.record("progress-only", runs_dir=runs_dir) as run:
        files = store.files(run.run_id)
        request = request_profile(files, steps=2)
        run.profiler.poll_now()  # what the poller does within a second, here on this thread
        for step in range(1, 6):
            jnp.ones(8).sum().block_until_ready()
            run.progress(step, 5, "step")
        answer = wait_for_answer(files, request.id, timeout=60, poll=0.05)
    assert answer is not None and answer.state == "done"
    assert (answer.first_step, answer.last_step) == (2, 3)  # the step after the look, and the one after it


def test_a_profile_asked_of_a_keras_fit_on_jax_uses_jax_s_profiler(tmp_path, monkeypatch):
    import keras

    from tpudash.callbacks import TpudashCallback

    monkeypatch.setattr("tpudash.recording.PROFILE_POLL_SECONDS", 0.02)  # the run looks often: a short test
    runs_dir = tmp_path / "runs"
    store = RunStore(runs_dir)
    stop = threading.Event()
    raised: list[BaseException] = []

    class StopWhenTold(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if stop.is_set():
                self.model.stop_training = True

    features = np.random.default_rng(0).normal(size=(256, 8)).astype("float32")
    labels = (features[:, 0] > 0).astype("int32")
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    def fit() -> None:
        try:
            callbacks = [TpudashCallback(name="keras-jax", runs_dir=runs_dir), StopWhenTold()]
            model.fit(features, labels, batch_size=32, epochs=10_000, verbose=0, callbacks=callbacks)
        except BaseException as error:  # noqa: BLE001 - said by the test below
            raised.append(error)
        finally:
            stop.set()

    training = threading.Thread(target=fit)
    training.start()
    try:
        pause = threading.Event()
        for _ in range(12_000):  # at most two minutes, looking every 10 ms: the fit starts on its own thread
            if store.run_ids() or stop.is_set():
                break
            pause.wait(0.01)
        (run_id,) = store.run_ids()
        files = store.files(run_id)
        request = request_profile(files, steps=3)
        answer = wait_for_answer(files, request.id, timeout=120, poll=0.05)
    finally:
        stop.set()
        training.join(120)
    assert not raised, raised
    assert answer is not None and answer.state == "done", answer
    assert answer.framework == "jax" and answer.last_step - answer.first_step == 2
    xplane = runs_dir / run_id / "profile" / "plugins" / "profile" / answer.capture / f"{answer.host}.xplane.pb"
    assert b"step_num" in xplane.read_bytes()
    assert store.load(run_id).info.status == "done"
