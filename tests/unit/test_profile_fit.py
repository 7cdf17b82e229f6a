"""A profile of a real Keras fit on TensorFlow, asked for over the bus while it trains (``TpudashCallback``).

The one end-to-end test of the writer's side with TensorFlow's own profiler
(the rest use a fake: ``test_profile_capture``): the fit runs on its own
thread, the test asks with ``request_profile`` as the dashboard does and waits
for the answer file; the capture lands where XProf looks, with the step
markers in it, and the run's record is whole.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from jobs.events import Log, RunFinished
from tpudash.profiles.requests import read_answers, request_profile, wait_for_answer
from tpudash.runs.store import RunStore


def test_a_profile_asked_of_a_live_fit_lands_where_xprof_looks(runtime, tmp_path, monkeypatch):
    # ``runtime``: the process's 8 logical CPU devices are set up before this fit starts TensorFlow's runtime
    # (they can be set only once, and the tests after this one train on them).
    import keras
    import tensorflow as tf

    from tpudash.callbacks import TpudashCallback

    monkeypatch.setattr("tpudash.recording.PROFILE_POLL_SECONDS", 0.02)  # the run looks often: a short test
    runs_dir = tmp_path / "runs"
    store = RunStore(runs_dir)
    stop = threading.Event()

    class StopWhenTold(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if stop.is_set():
                self.model.stop_training = True

    features = np.random.default_rng(0).normal(size=(256, 16)).astype("float32")
    labels = (features[:, 0] > 0).astype("int32")
    data = tf.data.Dataset.from_tensor_slices((features, labels)).batch(32).repeat()
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(2)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    raised: list[BaseException] = []

    def fit() -> None:
        try:
            model.fit(
                data,
                steps_per_epoch=8,
                epochs=10_000,  # until the test has its answer
                verbose=0,
                callbacks=[TpudashCallback(name="profiled", runs_dir=runs_dir), StopWhenTold()],
            )
        except BaseException as error:  # noqa: BLE001 - said by the test below
            raised.append(error)
        finally:
            stop.set()

    training = threading.Thread(target=fit)
    training.start()
    try:
        wait_until(lambda: store.run_ids() or stop.is_set())
        assert not raised, raised
        (run_id,) = store.run_ids()
        files = store.files(run_id)
        request = request_profile(files, steps=10)  # more than an epoch's 8: steps are numbered across epochs
        answer = wait_for_answer(files, request.id, timeout=120, poll=0.05)
    finally:
        stop.set()
        training.join(120)
    assert not raised, raised
    assert answer is not None and answer.state == "done", answer
    assert answer.framework == "tensorflow" and answer.worker == 0 and answer.reason is None
    assert answer.last_step - answer.first_step == 9 and answer.first_step >= 1
    capture = runs_dir / run_id / "profile" / "plugins" / "profile" / answer.capture
    xplane = capture / f"{answer.host}.xplane.pb"
    assert xplane.is_file() and xplane.stat().st_size > 0
    assert b"step_num" in xplane.read_bytes()  # the step markers XProf's overview reads steps from

    # The run is whole: done, its events readable, the profile said in its log; the answer stays done.
    data_of_run = store.load(run_id)
    assert data_of_run.info.status == "done" and not data_of_run.problems
    (finished,) = [event for _, event in data_of_run.events if isinstance(event, RunFinished)]
    assert finished.status == "done"
    logs = [event.text for _, event in data_of_run.events if isinstance(event, Log)]
    assert any(f"profile of steps {answer.first_step}–{answer.last_step} captured" in text for text in logs)
    assert [(each.id, each.state) for each in read_answers(files)] == [(request.id, "done")]


def wait_until(condition, timeout: float = 120.0) -> None:
    """Until ``condition()`` holds, looking every few milliseconds (bounded): the fit runs on its own thread."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        pause.wait(0.01)
