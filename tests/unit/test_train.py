"""The ``train`` job under the shared 8-replica CPU strategy, end to end through the runner.

Runs are kept tiny (a few steps of the light model at 4 examples per
replica) so each test stays within seconds of tracing time; the learning
test is the one that trains long enough to judge accuracy.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from jobs import datasets, get_job
from jobs.base import JobContext, ParamError
from jobs.events import Artifact, Metric, Progress, ReplicaValues, Stage
from jobs.trainplan import TrainingPlan, parse_profile_steps, tpu_advice
from jobs.trainreport import TrainingReporter

TINY = dict(source="synthetic", batch_per_replica=4, limit_train=64, limit_test=32, epochs=1)


def values(result, name, split="train"):
    return [metric.value for metric in result.metrics(name, split)]


def progress(result, unit):
    return [(event.done, event.total) for event in result.of_type(Progress) if event.unit == unit]


def tensorboard_scalars(run_dir: Path, folder: str) -> dict[str, list[float]]:
    import tensorflow as tf

    scalars: dict[str, list[float]] = {}
    for path in sorted((run_dir / "tensorboard" / folder).glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append(float(tf.make_ndarray(value.tensor)))
    return scalars


@pytest.mark.parametrize(
    ("dataset", "loop", "steps_per_execution"),
    # Each dataset, each loop and both steps_per_execution paths once: the
    # default suite has to stay under 10 minutes on 2 cores.
    [("mnist", "fit", 1), ("cifar10", "custom", 2)],
)
def test_trains_through_tfds_on_every_replica(run_job, runtime, dataset, loop, steps_per_execution):
    tfds = pytest.importorskip("tensorflow_datasets")
    with tfds.testing.mock_data(num_examples=64):
        result = run_job(
            "train",
            dataset=dataset,
            source="tfds",
            loop=loop,
            epochs=2,
            batch_per_replica=4,
            limit_test=40,
            steps_per_execution=steps_per_execution,
        )
    assert result.status == "done", result.finished.error
    assert runtime.num_replicas == 8
    # 64 examples, global batch 4 × 8 = 32: two steps per epoch, two epochs.
    assert [metric.step for metric in result.metrics("batch_loss")] == list(
        range(steps_per_execution, 5, steps_per_execution)
    )
    assert progress(result, "step")[-1] == (2, 2)
    assert progress(result, "epoch") == [(0, 2), (1, 2), (2, 2)]
    for split in ("train", "val"):
        assert [metric.epoch for metric in result.metrics("loss", split)] == [1, 2]
        assert all(0.0 <= value <= 1.0 for value in values(result, "accuracy", split))
    assert len(result.metrics("loss", "test")) == 1 and len(result.metrics("accuracy", "test")) == 1
    assert len(result.metrics("examples_per_second")) == 2
    assert all(value > 0 for value in values(result, "examples_per_second"))
    title = result.tables()[0].title
    assert title.startswith("model light") and f"{datasets.DATASETS[dataset].title} from tfds" in title
    assert result.summary["synthetic"] is False and result.summary["global_batch"] == 32
    assert result.summary["test_accuracy"] == values(result, "accuracy", "test")[0]
    # What the run did before its first step, in order, with the data counted.
    stages = result.of_type(Stage)
    names = [stage.name for index, stage in enumerate(stages) if index == 0 or stages[index - 1].name != stage.name]
    title = datasets.DATASETS[dataset].title
    assert names[:4] == [
        f"loading {title} from tfds",
        "building the model",
        "tracing and running the first step",
        "training",
    ]
    assert names[4:] == ["evaluating on the test split", "training", "evaluating on the test split"]
    data_counts = [(stage.done, stage.total) for stage in stages if stage.name == names[0] and stage.done]
    assert data_counts[-1] == (64 + 40, 64 + 40) and {total for _, total in data_counts} == {104}
    # Each replica's validation on its own share of the test split (40 examples: 5 each).
    per_replica = {event.name: event for event in result.of_type(ReplicaValues)}
    val_losses = per_replica["val loss per replica"]
    assert len(val_losses.values) == 8 and len(set(val_losses.devices)) == 8
    assert sum(val_losses.values) / 8 == pytest.approx(values(result, "loss", "val")[-1], rel=1e-5)
    val_accuracies = per_replica["val accuracy per replica"].values
    assert sum(val_accuracies) / 8 == pytest.approx(values(result, "accuracy", "val")[-1], rel=1e-5)


def test_writes_tensorboard_scalars_into_the_run_dir(run_job):
    result = run_job("train", **dict(TINY, epochs=2))
    assert result.status == "done", result.finished.error
    run_dir = result.run.run_dir
    artifacts = [event for event in result.of_type(Artifact) if event.kind == "tensorboard"]
    assert artifacts and Path(artifacts[0].path) == run_dir / "tensorboard"
    train = tensorboard_scalars(run_dir, "train")
    validation = tensorboard_scalars(run_dir, "validation")
    assert train["epoch_loss"] == pytest.approx(values(result, "loss"))
    assert validation["epoch_accuracy"] == pytest.approx(values(result, "accuracy", "val"))
    assert tensorboard_scalars(run_dir, "test")["epoch_loss"] == pytest.approx(values(result, "loss", "test"))


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_light_model_learns_the_synthetic_set(run_job, loop):
    # 10 balanced classes: guessing scores 0.1. Two short epochs reach about
    # 0.87-0.95 here; 0.5 leaves a wide margin for thread-order noise, and a
    # model that does not learn (no gradient flow, labels not matched to
    # images) stays near 0.1, far below it.
    result = run_job(
        "train", source="synthetic", loop=loop, epochs=2, batch_per_replica=32, limit_train=3072, limit_test=512
    )
    assert result.status == "done", result.finished.error
    assert values(result, "accuracy", "test")[0] > 0.5
    losses = values(result, "loss")
    assert losses[-1] < losses[0]
    assert result.summary["synthetic"] is True
    assert any("synthetic" in line and "not the real MNIST" in line for line in result.logs())


def test_mixed_bfloat16_trains_and_the_policy_is_restored(run_job):
    import keras

    before = keras.mixed_precision.global_policy().name
    result = run_job("train", precision="mixed_bfloat16", **TINY)
    assert result.status == "done", result.finished.error
    assert all(math.isfinite(value) for value in values(result, "batch_loss"))
    rows = result.tables()[0].rows
    assert rows[0][2] == "mixed_bfloat16"  # hidden layers compute in bfloat16…
    assert rows[-2][2] == "float32"  # …the output layer stays float32
    assert keras.mixed_precision.global_policy().name == before == "float32"


@pytest.mark.slow  # long: CI runs it after the default suite (pytest -m slow)
def test_deterministic_runs_give_identical_losses(run_job):
    from tensorflow.python.framework.config import is_op_determinism_enabled

    settings = dict(TINY, deterministic=True, epochs=1, seed=5)
    first = run_job("train", **settings)
    second = run_job("train", **settings)
    assert first.status == second.status == "done"
    assert values(first, "batch_loss") == values(second, "batch_loss")
    assert values(first, "loss", "val") == values(second, "loss", "val")
    assert not is_op_determinism_enabled()


def test_offline_without_data_fails_at_once_with_what_to_do(run_job, settings, monkeypatch):
    monkeypatch.setattr(datasets, "network_reachable", lambda hosts: False)
    result = run_job("train", source="tfds", dataset="mnist")
    assert result.status == "failed"
    error = result.finished.error
    assert error.startswith("DatasetUnavailable")
    assert str(settings.data_dir) in error and "--data-dir" in error and "source=synthetic" in error
    assert not result.of_type(Metric)


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_cancel_mid_epoch_stops_within_one_step_and_keeps_the_metrics(run_job, store, loop):
    def cancel_after_first_step(run, event):
        if isinstance(event, Metric) and event.name == "batch_loss":
            run.cancel_event.set()

    result = run_job("train", on_event=cancel_after_first_step, loop=loop, **dict(TINY, limit_train=640, epochs=3))
    assert result.status == "cancelled"
    assert [metric.step for metric in result.metrics("batch_loss")] == [1]  # of 20 steps in the epoch
    assert not result.metrics("loss", "val") and not result.metrics("loss", "test")
    on_disk = store.load(result.run.run_id)
    assert on_disk.info.status == "cancelled"
    stored = [event for _, event in on_disk.events if isinstance(event, Metric)]
    assert [(metric.name, metric.step) for metric in stored] == [("batch_loss", 1), ("batch_accuracy", 1)]


def test_profile_steps_write_a_non_empty_trace(run_job):
    result = run_job("train", profile_steps="2-3", **dict(TINY, limit_train=128))
    assert result.status == "done", result.finished.error
    profiles = [event for event in result.of_type(Artifact) if event.kind == "profile"]
    assert len(profiles) == 1
    traces = list(Path(profiles[0].path).glob("*.xplane.pb"))
    assert traces and all(trace.stat().st_size > 0 for trace in traces)
    # Run by the engine: where XProf and `tpudash profile RUN --list` look, <run>/profile.
    assert Path(profiles[0].path).is_relative_to(result.run.run_dir / "profile" / "plugins" / "profile")
    assert result.summary["profile"] == profiles[0].path


def test_profile_steps_past_the_end_warn_instead_of_tracing(run_job):
    result = run_job("train", profile_steps="50-60", **TINY)
    assert result.status == "done"
    assert not [event for event in result.of_type(Artifact) if event.kind == "profile"]
    assert any("profile_steps 50-60 was never reached" in line and "step 2" in line for line in result.logs())


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_early_stopping_ends_a_run_whose_val_loss_stalls(run_job, loop):
    # Steps of 1e-12 are below float32 resolution for the weights, so
    # val_loss after epoch 2 equals epoch 1's: no improvement, patience 1
    # stops the run there (Keras never stops after the first epoch).
    result = run_job(
        "train",
        loop=loop,
        optimizer="sgd",
        learning_rate=1e-12,
        early_stopping_patience=1,
        deterministic=True,
        **dict(TINY, epochs=6),
    )
    assert result.status == "done", result.finished.error
    assert values(result, "loss", "val")[0] == values(result, "loss", "val")[1]
    assert result.summary["early_stopped"] is True
    assert result.summary["epochs_run"] == 2
    assert any(line.startswith("early stopping after epoch 2") and "restored" in line for line in result.logs())
    assert len(result.metrics("loss", "test")) == 1


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("dataset", "imagenet"),
        ("source", "disk"),
        ("model", "resnet50"),
        ("precision", "float16"),
        ("optimizer", "lamb"),
        ("loop", "eager"),
        ("batch_per_replica", "0"),
        ("batch_per_replica", "-8"),
        ("learning_rate", "0"),
        ("learning_rate", "-0.1"),
        ("epochs", "0"),
        ("steps_per_execution", "0"),
        ("profile_steps", "10-5"),
        ("profile_steps", "0-3"),
        ("profile_steps", "five"),
    ],
)
def test_bad_params_are_refused_naming_the_field(field, value):
    with pytest.raises(ParamError) as raised:
        get_job("train").resolve({field: value})
    assert raised.value.field == field
    assert str(raised.value).startswith(f"{field}: ")


def test_a_limit_smaller_than_one_global_batch_is_refused():
    spec = get_job("train")
    params = spec.resolve({"batch_per_replica": "16", "limit_train": "100"})
    with pytest.raises(ParamError) as raised:
        spec.check_runtime(params, SimpleNamespace(num_replicas=8))
    assert raised.value.field == "limit_train" and "128" in raised.value.message


def test_profile_steps_parse():
    assert parse_profile_steps("") is None
    assert parse_profile_steps(" 5-10 ") == (5, 10)
    assert parse_profile_steps("7") == (7, 7)


def test_tpu_advice_follows_the_cloud_tpu_performance_guide():
    advice = tpu_advice("TPU", per_replica_batch=25, replicas=8, steps_per_execution=1, precision="float32")
    assert len(advice) == 4
    assert "global batch 200 is not a multiple of 128" in advice[0]
    assert "not a multiple of 8" in advice[1]
    assert "steps_per_execution is 1" in advice[2]
    assert "mixed_bfloat16" in advice[3]
    assert tpu_advice("TPU", per_replica_batch=64, replicas=8, steps_per_execution=50, precision="mixed_bfloat16") == []
    assert tpu_advice("CPU", per_replica_batch=25, replicas=8, steps_per_execution=1, precision="float32") == []


def test_an_epoch_is_whole_executions_of_whole_global_batches():
    params = {"batch_per_replica": 4, "steps_per_execution": 10, "epochs": 1}
    plan = TrainingPlan.make(params, replicas=8, train_examples=1000, test_examples=100)
    assert (plan.global_batch, plan.steps_per_epoch, plan.steps_per_execution) == (32, 30, 10)
    assert plan.evaluation_steps == 4  # 100 test examples: 3 full batches and a partial one
    longer = TrainingPlan.make(
        dict(params, steps_per_execution=100),
        replicas=8,
        train_examples=1000,
        test_examples=100,
        drop_partial_test_batch=True,
    )
    assert (longer.steps_per_epoch, longer.steps_per_execution, longer.evaluation_steps) == (31, 31, 3)


def test_batch_metrics_are_the_mean_of_each_execution_not_the_running_mean(tmp_path):
    events = []
    ctx = JobContext(runtime=None, emit=events.append, run_dir=tmp_path)
    plan = TrainingPlan.make({"batch_per_replica": 1, "steps_per_execution": 2, "epochs": 1}, 1, 8, 1)
    reporter = TrainingReporter(ctx, plan, tmp_path, profile=None)
    reporter.begin_epoch(1)
    reporter.after_execution(2, mean_loss=3.0, mean_accuracy=0.25)  # steps 1-2 average 3.0
    reporter.after_execution(4, mean_loss=2.0, mean_accuracy=0.5)  # steps 3-4 must average 1.0
    reporter.close()
    batch_losses = [
        (event.step, event.value) for event in events if isinstance(event, Metric) and event.name == "batch_loss"
    ]
    batch_accuracies = [event.value for event in events if isinstance(event, Metric) and event.name == "batch_accuracy"]
    assert batch_losses == [(2, 3.0), (4, 1.0)]
    assert batch_accuracies == [0.25, 0.75]
