"""``TpudashWriter``: a loop that logs through CLU's MetricWriter interface writes a tpudash run (no CLU, no JAX here)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import tpudash
from jobs.events import Log, Metric, Progress, RunStarted, Table
from tpudash.metric_writer import TpudashWriter, metric_name_and_split
from tpudash.recording import RecordingError
from tpudash.runs.model import RunModel

# CLU's MetricWriter methods (clu/metric_writers/interface.py): a writer without one breaks a MultiWriter.
CLU_METHODS = (
    "write_summaries",
    "write_scalars",
    "write_images",
    "write_videos",
    "write_audios",
    "write_texts",
    "write_histograms",
    "write_pointcloud",
    "write_hparams",
    "flush",
    "close",
)


class StandInMultiWriter:
    """What CLU's MultiWriter does with its writers: every call goes to each, in turn."""

    def __init__(self, writers):
        self.writers = writers

    def __getattr__(self, method):
        def every_writer(*args, **kwargs):
            for writer in self.writers:
                getattr(writer, method)(*args, **kwargs)

        return every_writer


class Collecting:
    """Another writer in the MultiWriter (CLU's LoggingWriter, say): what reached it."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, method):
        return lambda *args, **kwargs: self.calls.append(method)


def only_run(store):
    (run_id,) = store.run_ids()
    return store.load(run_id)


def events_of(data, kind):
    return [event for _, event in data.events if isinstance(event, kind)]


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("train/loss", ("loss", "train")),
        ("eval/accuracy", ("accuracy", "val")),
        ("val_loss", ("loss", "val")),
        ("test/acc", ("acc", "test")),
        ("validation/metrics/top1", ("metrics/top1", "val")),
        ("learning_rate", ("learning_rate", "train")),
        ("grad_norm/layer0", ("grad_norm/layer0", "train")),
        ("val_", ("val_", "train")),
    ],
)
def test_a_scalar_name_says_its_split(key, expected):
    assert metric_name_and_split(key) == expected


def test_a_clu_loop_switched_in_one_line_records_its_run(store):
    writer = tpudash.TpudashWriter("clu loop")
    writer.write_hparams({"learning_rate": 0.1, "batch_size": 64})
    for step in range(1, 4):
        writer.write_scalars(step, {"train/loss": np.float32(1.0 / step), "learning_rate": 0.1})
    writer.write_scalars(3, {"eval/accuracy": np.array(0.75)})
    writer.write_texts(3, {"note": "halfway"})
    writer.close()
    writer.close()  # CLU's ensure_flushes and a MultiWriter may both close: the second does nothing

    data = only_run(store)
    assert data.info.status == "done" and data.info.job == "clu loop"
    assert data.info.params == {"learning_rate": 0.1, "batch_size": 64}
    model = RunModel.from_events(data.events)
    assert model.tracks[("loss", "train", "step")].count == 3
    assert model.final_metrics["loss"] == pytest.approx(1 / 3) and model.final_metrics["val_accuracy"] == 0.75
    assert [event.done for event in events_of(data, Progress)] == [1, 2, 3]
    assert "note (step 3): halfway" in [event.text for event in events_of(data, Log)]


def test_hparams_after_the_first_write_are_a_table_and_a_log_line(store):
    with TpudashWriter("late hparams", params={"seed": 1}) as writer:
        writer.write_scalars(0, {"loss": 2.0})
        writer.write_hparams({"dropout": 0.1})
    data = only_run(store)
    assert data.info.params == {"seed": 1}
    (table,) = events_of(data, Table)
    assert (table.title, table.columns, table.rows) == ("hyperparameters", ["name", "value"], [["dropout", 0.1]])
    assert any("hyperparameters written after the run started" in event.text for event in events_of(data, Log))


def test_what_tpudash_does_not_show_is_accepted_and_said_once(store):
    image = np.zeros((2, 4, 4, 3))
    with TpudashWriter("media") as writer:
        for step in range(3):
            writer.write_images(step, {"samples": image})
            writer.write_histograms(step, {"weights": np.arange(10.0)}, num_buckets={"weights": 5})
            writer.write_audios(step, {"voice": np.zeros((1, 8, 1))}, sample_rate=16000)
            writer.write_videos(step, {"clip": np.zeros((1, 2, 4, 4, 3))})
            writer.write_pointcloud(step, {"cloud": np.zeros((1, 5, 3))}, point_colors=None, configs=None)
            writer.write_summaries(step, {"raw": np.zeros(3)}, metadata=None)
    lines = [event.text for event in events_of(only_run(store), Log)]
    assert len(lines) == 6
    assert lines[0] == (
        "write_images (samples): tpudash does not show images; they are not recorded "
        "(a TensorBoard writer beside this one in a MultiWriter keeps them)"
    )


def test_it_has_clus_interface_and_works_inside_a_multiwriter(store):
    writer = TpudashWriter("multi")
    assert all(callable(getattr(writer, method)) for method in CLU_METHODS)
    other = Collecting()
    multi = StandInMultiWriter([other, writer])
    multi.write_hparams({"lr": 0.01})
    multi.write_scalars(1, {"train/loss": 0.5})
    multi.flush()
    multi.close()
    assert other.calls == ["write_hparams", "write_scalars", "flush", "close"]
    data = only_run(store)
    assert data.info.status == "done" and data.info.params == {"lr": 0.01}
    assert [event.value for event in events_of(data, Metric)] == [0.5]


def test_the_run_starts_at_the_first_write_and_a_writer_never_written_makes_none(store):
    writer = TpudashWriter("idle")
    assert writer.run is None
    writer.close()
    assert store.run_ids() == []
    writer = TpudashWriter("busy")
    writer.write_scalars(0, {"loss": 1.0})
    writer.flush()
    assert store.run_ids() == [writer.run.run_id]
    (started,) = events_of(store.load(writer.run.run_id), RunStarted)
    assert started.job == "busy"
    writer.close()


@pytest.mark.parametrize(
    ("raised", "status"), [(RuntimeError("diverged"), "failed"), (KeyboardInterrupt(), "cancelled")]
)
def test_an_exception_in_the_loop_finishes_the_run_as_record_does(store, raised, status):
    with pytest.raises(type(raised)), TpudashWriter("crashing") as writer:
        writer.write_scalars(0, {"loss": 1.0})
        raise raised
    assert only_run(store).info.status == status


@pytest.mark.parametrize("name", ["", "   ", "\t\n"])
def test_an_empty_or_blank_name_is_refused_naming_the_field_before_any_run_exists(store, name):
    with pytest.raises(RecordingError, match=f"^name: {re.escape(repr(name))} is not allowed; allowed: a non-empty"):
        TpudashWriter(name)
    assert store.run_ids() == []


def test_bad_input_names_the_field(store):
    with pytest.raises(RecordingError, match="hparams: list is not allowed"):
        TpudashWriter("x").write_hparams([1, 2])
    with TpudashWriter("bad value") as writer, pytest.raises(RecordingError, match="value: 'high' is not a number"):
        writer.write_scalars(0, {"loss": "high"})
