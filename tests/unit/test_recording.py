"""The user's own training recorded as tpudash runs: ``tpudash.record`` and ``TpudashCallback``."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

import tpudash
from jobs.events import Metric, Progress, ReplicaValues, RunFinished, RunStarted, Table
from tests.fit_process import GLOBAL_BATCH, separable_data, separable_model
from tpudash.recording import RecordingError, _finish_open_runs
from tpudash.runs.layout import SOURCE_CALLBACK, SOURCE_RECORD
from tpudash.runs.model import RunModel
from tpudash.runs.store import RunStore
from tpudash.runs.tail import EventTail


def only_run(store: RunStore):
    (run_id,) = store.run_ids()
    return store.load(run_id)


def events_of(data, kind):
    return [event for _, event in data.events if isinstance(event, kind)]


# -- tpudash.record -------------------------------------------------------------------------


def test_a_custom_loop_with_per_replica_values_is_a_run_like_any_job(runtime, store):
    strategy = runtime.strategy
    with tpudash.record("my loop", params={"lr": 0.1}, strategy=strategy) as run:
        for step in range(5):
            run.metric("loss", 1.0 / (step + 1), step=step)
            run.progress(step + 1, 5, "step")
        per_replica = strategy.run(lambda: tf_replica_id() * 2.0)
        run.replica_values("doubled replica id", per_replica)
        run.metric("loss", 0.1, epoch=1, split="val")

    data = only_run(store)
    assert data.info.status == "done" and data.info.source == SOURCE_RECORD and not data.problems
    assert data.info.job == "my loop" and data.info.params == {"lr": 0.1}
    assert "-my-loop-" in data.info.run_id
    started = events_of(data, RunStarted)[0]
    assert (started.runtime["strategy"], started.runtime["num_replicas"]) == ("MirroredStrategy", 8)
    assert started.runtime["simulated"] is True and started.runtime["pid"] == data.info.pid
    (replicas,) = events_of(data, ReplicaValues)
    assert replicas.values == [2.0 * index for index in range(8)]
    assert [device.rsplit(":", 1)[1] for device in replicas.devices] == [str(index) for index in range(8)]
    model = RunModel.from_events(data.events)
    assert model.tracks[("loss", "train", "step")].count == 5
    assert model.final_metrics["val_loss"] == 0.1
    assert data.info.final_metrics["loss"] == pytest.approx(0.2)


def tf_replica_id():
    import tensorflow as tf

    return tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group, tf.float32)


def test_an_exception_records_failed_with_its_traceback_and_still_raises(store):
    with pytest.raises(ZeroDivisionError):
        with tpudash.record("diverges") as run:
            run.metric("loss", 1.0)
            _ = 1 / 0
    data = only_run(store)
    finished = events_of(data, RunFinished)[0]
    assert finished.status == "failed" and finished.error == "ZeroDivisionError: division by zero"
    assert "1 / 0" in finished.traceback
    assert data.info.final_metrics == {"loss": 1.0}


def test_ctrl_c_records_cancelled(store):
    with pytest.raises(KeyboardInterrupt):
        with tpudash.record("interrupted"):
            raise KeyboardInterrupt
    assert only_run(store).info.status == "cancelled"


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda run: run.metric("loss", 1.0, split="validation"),
            "split: 'validation' is not allowed; allowed: train, val, test",
        ),
        (lambda run: run.metric("loss", "low"), "value: 'low' is not a number"),
        (lambda run: run.metric("loss", 1.0, step=-1), "step: -1 is not allowed; allowed: a whole number ≥ 0"),
        (lambda run: run.metric("", 1.0), "name: '' is not allowed"),
        (lambda run: run.progress(1, 2, unit=""), "unit: '' is not allowed"),
        (lambda run: run.replica_values("x", 3.0), "value: float is not per-replica"),
        (lambda run: run.replica_values("x", [1, 2], devices=["a"]), "devices: 1 given for 2 replica values"),
        (lambda run: run.log("hi", level="loud"), "level: 'loud' is not allowed; allowed: debug, info, warning, error"),
    ],
)
def test_bad_input_names_the_argument_and_what_is_allowed_and_the_run_goes_on(store, call, message):
    with tpudash.record("checked") as run:
        with pytest.raises(RecordingError, match=message.replace("(", r"\(").replace(")", r"\)")):
            call(run)
        run.metric("loss", 0.5)
    data = only_run(store)
    assert data.info.status == "done" and data.info.final_metrics == {"loss": 0.5}


@pytest.mark.parametrize("name", ["", "   ", "\t\n"])
def test_an_empty_or_blank_name_is_refused_naming_the_field_before_any_run_directory_exists(store, name):
    with pytest.raises(RecordingError, match=f"^name: {re.escape(repr(name))} is not allowed; allowed: a non-empty"):
        tpudash.record(name)
    assert store.run_ids() == []


def test_bad_params_are_refused_before_any_run_directory_exists(store):
    with pytest.raises(RecordingError, match="params: list is not allowed"):
        tpudash.record("run", params=[1, 2])
    assert store.run_ids() == []


def test_a_finished_run_refuses_more_and_says_so(store):
    with tpudash.record("short") as run:
        pass
    with pytest.raises(RecordingError, match="has finished \\(done\\)"):
        run.metric("loss", 1.0)


def test_events_reach_the_file_without_the_run_finishing(store):
    """The writer thread writes on its own: a dashboard sees a run that never calls flush or finish."""
    run = tpudash.record("growing")
    run.metric("loss", 2.0)
    tail = EventTail(run.run_dir / "events.jsonl")
    seen: list = []
    deadline = 200
    while not any(isinstance(event, Metric) for _, event in seen) and deadline:
        seen += tail.read_new()
        run._recorder._writer_stop.wait(0.05)  # the writer's own clock: a quarter second per write
        deadline -= 1
    assert any(isinstance(event, Metric) and event.value == 2.0 for _, event in seen)
    assert json.loads((run.run_dir / "run.json").read_text())["status"] == "running"
    run.finish()


def test_the_training_thread_never_fsyncs_until_the_run_ends(store, monkeypatch):
    """Recording only appends to memory: the writer thread writes and fsyncs (at most once a second)."""
    import os
    import threading

    import tpudash.runs.recorder as records

    fsyncs: list[str] = []
    real_fsync = os.fsync

    def counting_fsync(descriptor):
        fsyncs.append(threading.current_thread().name)
        real_fsync(descriptor)

    monkeypatch.setattr(records.os, "fsync", counting_fsync)
    run = tpudash.record("busy")
    fsyncs.clear()  # creating the run writes run.json once, before training starts
    for step in range(5000):
        run.metric("loss", 1.0 / (step + 1), step=step)
    run.progress(1, 1, "epoch")  # an epoch: run.json is rewritten, by the writer thread too
    training_thread = threading.current_thread().name
    assert training_thread not in fsyncs
    run.finish()
    assert fsyncs.count(training_thread) == 2  # the finish, once, when the run is over: events.jsonl and run.json
    assert only_run(store).info.final_metrics == {"loss": pytest.approx(1 / 5000)}


def test_a_run_left_open_at_exit_is_recorded_failed(store):
    run = tpudash.record("abandoned")
    run.metric("loss", 1.0)
    _finish_open_runs()  # what atexit runs
    data = only_run(store)
    assert data.info.status == "failed"
    assert data.info.error == "the process exited before the run finished"
    assert run.finished


# -- TpudashCallback -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fresh_model(runtime):
    """One model for the module's fits: its train step is traced once (the first fit sees it untrained)."""
    return separable_model(runtime.strategy)


def test_fit_with_the_callback_records_the_model_every_batch_every_epoch_and_learns(runtime, store, fresh_model):
    from tpudash.callbacks import TpudashCallback

    train, val, steps, validation_steps = separable_data(runtime.strategy)
    model = fresh_model
    callback = TpudashCallback(every_n_batches=1, batch_size=GLOBAL_BATCH)
    history = model.fit(
        train,
        epochs=3,
        steps_per_epoch=steps,
        validation_data=val,
        validation_steps=validation_steps,
        verbose=0,
        callbacks=[callback],
    )

    data = only_run(store)
    info = data.info
    assert (info.status, info.source, info.job) == ("done", SOURCE_CALLBACK, "separable") and not data.problems
    started = events_of(data, RunStarted)[0]
    assert started.params["parameters"] == model.count_params() == 8 * 16 + 16 + 16 * 2 + 2
    assert (started.params["epochs"], started.params["steps_per_epoch"], started.params["batch_size"]) == (3, 12, 64)
    assert (started.params["optimizer"], started.params["learning_rate"]) == ("Adam", pytest.approx(0.02))
    assert (started.runtime["strategy"], started.runtime["num_replicas"], started.runtime["kind"]) == (
        "MirroredStrategy",
        8,
        "CPU",
    )
    assert started.runtime["tensorflow"] and started.runtime["keras"] and started.runtime["pid"] == info.pid
    (summary_table,) = events_of(data, Table)
    assert [row[:2] for row in summary_table.rows] == [[layer.name, "Dense"] for layer in model.layers]
    assert [row[3] for row in summary_table.rows] == [8 * 16 + 16, 16 * 2 + 2]

    metrics = events_of(data, Metric)
    batch_losses = [metric for metric in metrics if metric.name == "batch_loss"]
    assert [metric.step for metric in batch_losses] == list(range(1, 37))  # 12 steps × 3 epochs
    for epoch in (1, 2, 3):
        # Each point is one batch's loss: their mean is the epoch's loss Keras reports.
        per_batch = [metric.value for metric in batch_losses if metric.epoch == epoch]
        assert np.mean(per_batch) == pytest.approx(history.history["loss"][epoch - 1], rel=1e-4)
    val_losses = [metric.value for metric in metrics if metric.name == "loss" and metric.split == "val"]
    assert val_losses == pytest.approx(history.history["val_loss"])
    assert val_losses[-1] < 0.5 * val_losses[0] or val_losses[-1] < 0.2  # it learns
    rates = [metric for metric in metrics if metric.name == "examples_per_second"]
    assert len(rates) == 3 and all(rate.value > 0 for rate in rates)
    epochs = [event for event in events_of(data, Progress) if event.unit == "epoch"]
    assert [(event.done, event.total) for event in epochs] == [(1, 3), (2, 3), (3, 3)]
    finished = events_of(data, RunFinished)[0]
    assert finished.summary["epochs"] == 3 and finished.summary["val_accuracy"] > 0.9
    assert info.final_metrics["val_accuracy"] == pytest.approx(history.history["val_accuracy"][-1])


def test_without_every_n_batches_batch_points_are_decimated(runtime, tmp_path, fresh_model):
    from tpudash.callbacks import MIN_SECONDS_BETWEEN_BATCH_POINTS, TpudashCallback

    train, _, steps, _ = separable_data(runtime.strategy, train_examples=GLOBAL_BATCH * 128)
    elsewhere = RunStore(tmp_path / "my-runs")
    fresh_model.fit(
        train,
        epochs=1,
        steps_per_epoch=steps,
        verbose=0,
        callbacks=[TpudashCallback(name="decimated", runs_dir=elsewhere.root)],
    )
    data = only_run(elsewhere)  # runs_dir is where the run went, not tpudash's default
    points = [metric for metric in events_of(data, Metric) if metric.name == "batch_loss"]
    seconds = data.info.finished - data.info.started
    # 128 batches, but at most one point per interval: a point a batch would cost a fast step its speed.
    assert 1 <= len(points) <= seconds / MIN_SECONDS_BETWEEN_BATCH_POINTS + 1
    assert points[-1].step <= 128


def test_fit_that_raises_in_a_step_is_recorded_failed_or_cancelled_and_raises_unchanged(runtime, store):
    import keras

    from tpudash.callbacks import TpudashCallback

    train, _, steps, _ = separable_data(runtime.strategy)
    model = separable_model(runtime.strategy)
    model.make_train_function()
    steady_step = model.train_function
    failures = {"second-fit": KeyboardInterrupt(), "third-fit": ValueError("a corrupt record in shard 3")}
    calls = []

    def step_that_fails(iterator):
        calls.append(1)
        failure = failures.get(callback.name)
        if failure is not None and len(calls) % 4 == 3:
            raise failure
        return steady_step(iterator)

    model.train_function = step_that_fails

    class FailsAtEpochEnd(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            raise OSError("checkpoint disk full")

    callback = TpudashCallback(name="first-fit", every_n_batches=1)
    with pytest.raises(OSError, match="checkpoint disk full"):
        model.fit(train, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[callback, FailsAtEpochEnd()])
    for name, raised in (("second-fit", KeyboardInterrupt), ("third-fit", ValueError)):
        callback.name = name
        with pytest.raises(raised):
            model.fit(train, epochs=2, steps_per_epoch=steps, verbose=0, callbacks=[callback])
    callback.name = "fourth-fit"
    model.fit(train, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[callback])
    assert model.train_function is step_that_fails  # the guard is gone again

    by_name = {info.job: info for info in store.list_runs()}
    assert by_name["first-fit"].status == "failed"
    assert "outside a training step" in by_name["first-fit"].error
    assert by_name["second-fit"].status == "cancelled"
    third = store.load(by_name["third-fit"].run_id)
    finished = events_of(third, RunFinished)[0]
    assert finished.status == "failed" and finished.error == "ValueError: a corrupt record in shard 3"
    assert "step_that_fails" in finished.traceback
    assert any(metric.name == "batch_loss" for metric in events_of(third, Metric))  # what it did is kept
    assert by_name["fourth-fit"].status == "done"


def test_callback_options_are_checked_with_the_field_named():
    from tpudash.callbacks import TpudashCallback

    with pytest.raises(RecordingError, match="every_n_batches: 0 is not allowed; allowed: a whole number ≥ 1"):
        TpudashCallback(every_n_batches=0)
    with pytest.raises(RecordingError, match="batch_size: 'big' is not allowed"):
        TpudashCallback(batch_size="big")
    with pytest.raises(RecordingError, match="runs_dir: is empty"):
        tpudash.record("run", runs_dir=" ")


@pytest.mark.parametrize(
    "runs_dir, said",
    [
        ("", "runs_dir: is empty; allowed: a directory path, file://PATH, gs://BUCKET/PATH"),
        ("  ", "runs_dir: is empty; allowed: a directory path"),
        (5, "runs_dir: 5 is not allowed; allowed: a directory path, file://PATH, gs://BUCKET/PATH"),
        ("gs//bucket/runs", "runs_dir: "),
    ],
)
def test_a_callback_with_a_runs_dir_it_cannot_record_into_raises_at_construction(runs_dir, said):
    """Issue 38: ``TpudashCallback(runs_dir="")`` trained and recorded nothing, with one warning lost in fit's output."""
    from tpudash.callbacks import TpudashCallback

    with pytest.raises(ValueError, match="^" + re.escape(said)) as raised:
        TpudashCallback(runs_dir=runs_dir)
    assert isinstance(raised.value, RecordingError)
    assert "or None for tpudash's runs directory" in str(raised.value) or runs_dir == "gs//bucket/runs"


def test_a_callback_takes_a_runs_dir_it_can_record_into(tmp_path):
    from tpudash.callbacks import TpudashCallback

    assert TpudashCallback(runs_dir=tmp_path / "runs").runs_dir == tmp_path / "runs"
    assert TpudashCallback(runs_dir=str(tmp_path)).runs_dir == str(tmp_path)
    assert TpudashCallback(runs_dir="memory://runs").runs_dir == "memory://runs"
    assert TpudashCallback().runs_dir is None


def test_nan_loss_is_recorded_as_nan_not_a_crash(store):
    with tpudash.record("nan") as run:
        run.metric("loss", float("nan"))
    assert math.isnan(only_run(store).info.final_metrics["loss"])


def test_fit_goes_on_when_its_run_cannot_be_created(runtime, tmp_path, fresh_model):
    """A runs directory that cannot be written (a full disk, a file in its place) costs the record, not the fit."""
    from tpudash.callbacks import TpudashCallback

    blocked = tmp_path / "not-a-directory"
    blocked.write_text("a file where the runs directory should be")
    train, val, steps, validation_steps = separable_data(runtime.strategy)
    callback = TpudashCallback(runs_dir=blocked / "runs")
    with pytest.warns(UserWarning, match="tpudash: cannot record this fit"):
        history = fresh_model.fit(train, epochs=2, steps_per_epoch=steps, verbose=0, callbacks=[callback])
    assert len(history.history["loss"]) == 2 and callback.run is None
