"""The ``train`` job on JAX (no TensorFlow): Keras 3 under ``DataParallel`` over the 8 CPU devices, through the runner.

The same params, events and summary as the TensorFlow job (tests/unit/test_train.py); runs are
kept small (the light model, a few hundred synthetic examples) so that each test stays within a
few seconds of compiling on 2 cores.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")  # before Keras: tests/jax/conftest.py has chosen its backend
pytest.importorskip("keras")

from jobs.events import Artifact, Metric, Progress, ReplicaValues, Stage  # noqa: E402

SMALL = dict(source="synthetic", batch_per_replica=8, limit_train=512, limit_test=80)


@pytest.fixture(scope="module")
def runtime():
    """JAX's runtime over the 8 CPU devices, detected once for this module (the TensorFlow one is never built)."""
    from tpudash.accel.jaxdetect import detect_jax

    return detect_jax(8, use_tpu=False)


def values(result, name, split="train"):
    return [metric.value for metric in result.metrics(name, split)]


def test_mnist_synthetic_learns_on_8_devices_with_the_tensorflow_jobs_events(run_job, runtime):
    result = run_job("train", epochs=2, learning_rate=0.01, **SMALL)
    assert result.status == "done", result.finished.error
    assert "tensorflow" not in sys.modules
    assert runtime.framework == "jax" and runtime.num_replicas == 8
    # 512 examples, global batch 8 × 8 = 64: 8 steps an epoch, two epochs.
    assert [metric.step for metric in result.metrics("batch_loss")] == list(range(1, 17))
    assert [(e.done, e.total) for e in result.of_type(Progress) if e.unit == "epoch"] == [(0, 2), (1, 2), (2, 2)]
    for split in ("train", "val"):
        assert [metric.epoch for metric in result.metrics("loss", split)] == [1, 2]
    losses = values(result, "loss")
    assert losses[-1] < losses[0]
    # 10 balanced classes: guessing scores 0.1; the synthetic set is learnt in two short epochs.
    assert values(result, "accuracy", "test")[0] > 0.5
    summary = result.summary
    assert summary["test_accuracy"] == values(result, "accuracy", "test")[0]
    assert (summary["replicas"], summary["global_batch"], summary["steps_per_epoch"]) == (8, 64, 8)
    assert (summary["loop"], summary["synthetic"], summary["epochs_run"], summary["steps"]) == ("fit", True, 2, 16)
    assert summary["examples_per_second"] > 0
    stages = result.of_type(Stage)
    names = [stage.name for index, stage in enumerate(stages) if index == 0 or stages[index - 1].name != stage.name]
    assert names[:4] == [
        "making synthetic MNIST-shaped data",
        "building the model",
        "tracing and running the first step",
        "training",
    ]
    assert names[4:] == ["evaluating on the test split", "training", "evaluating on the test split"]
    # Each device's validation on the rows it held: 80 test examples, 10 each (the last batch dealt out evenly); their mean is the val figure.
    per_device = {event.name: event for event in result.of_type(ReplicaValues)}
    val_losses = per_device["val loss per replica"]
    assert val_losses.devices == [f"CPU:{index}" for index in range(8)]
    assert sum(val_losses.values) / 8 == pytest.approx(values(result, "loss", "val")[-1], rel=1e-5)
    val_accuracies = per_device["val accuracy per replica"].values
    assert sum(val_accuracies) / 8 == pytest.approx(values(result, "accuracy", "val")[-1], rel=1e-5)
    assert result.tables()[0].title.startswith("model light on synthetic MNIST-shaped data")
    # TensorBoard's epoch scalars, written without TensorFlow, in the folders the TensorFlow job uses.
    [tensorboard] = [event for event in result.of_type(Artifact) if event.kind == "tensorboard"]
    assert tensorboard.path == summary["tensorboard"] == str(result.run.run_dir / "tensorboard")
    for folder, tag in (
        ("train", b"epoch_examples_per_second"),
        ("validation", b"epoch_accuracy"),
        ("test", b"epoch_loss"),
    ):
        (events,) = (result.run.run_dir / "tensorboard" / folder).glob("events.out.tfevents.*")
        assert tag in events.read_bytes()


def test_what_jax_has_not_is_said_and_the_run_trains_on(run_job):
    # tfds (it reads with TensorFlow) and the "Use TPUs" guide's tf.distribute loop: said, then synthetic data and fit.
    if importlib.util.find_spec("tensorflow_datasets") is not None:
        pytest.skip("tensorflow_datasets is installed here: the JAX environment this checks has none")
    result = run_job("train", loop="custom", **dict(SMALL, source="tfds", epochs=1, limit_train=64, limit_test=64))
    assert result.status == "done", result.finished.error
    warnings = [event.text for event in result.events if event.type == "log" and event.level == "warning"]
    assert any("tensorflow_datasets is not installed here" in line for line in warnings)
    assert any(
        line.startswith("loop=custom is the custom loop") and "Keras fit trains instead" in line for line in warnings
    )
    assert (result.summary["source"], result.summary["synthetic"], result.summary["loop"]) == ("synthetic", True, "fit")


def test_early_stopping_ends_a_run_whose_val_loss_stalls(run_job):
    # Steps of 1e-12 are below float32 resolution for the weights: val_loss repeats, patience 1 stops at epoch 2.
    result = run_job(
        "train",
        optimizer="sgd",
        learning_rate=1e-12,
        early_stopping_patience=1,
        steps_per_execution=2,
        **dict(SMALL, epochs=6, limit_train=128, limit_test=64),
    )
    assert result.status == "done", result.finished.error
    # Two steps an epoch, run as one execution of steps_per_execution=2: one point per execution.
    assert [metric.step for metric in result.metrics("batch_loss")] == [2, 4]
    assert values(result, "loss", "val")[0] == values(result, "loss", "val")[1]
    assert (result.summary["early_stopped"], result.summary["epochs_run"]) == (True, 2)
    assert any(line.startswith("early stopping after epoch 2") and "restored" in line for line in result.logs())
    assert len(result.metrics("loss", "test")) == 1


def test_cancel_mid_epoch_stops_within_one_step_and_keeps_the_metrics(run_job, store):
    def cancel_after_first_step(run, event):
        if isinstance(event, Metric) and event.name == "batch_loss":
            run.cancel_event.set()

    result = run_job("train", on_event=cancel_after_first_step, **dict(SMALL, epochs=3))
    assert result.status == "cancelled"
    assert [metric.step for metric in result.metrics("batch_loss")] == [1]  # of 8 steps in the epoch
    assert not result.metrics("loss", "val") and not result.metrics("loss", "test")
    stored = [event for _, event in store.load(result.run.run_id).events if isinstance(event, Metric)]
    assert [(metric.name, metric.step) for metric in stored] == [("batch_loss", 1), ("batch_accuracy", 1)]


def test_profile_steps_in_the_engine_are_captured_by_jax_profiler_where_xprof_looks(run_job):
    # Run by the engine's runner, the run's profile responder captures the window with JAX's profiler (not TensorFlow's).
    result = run_job("train", epochs=1, profile_steps="2-3", **SMALL)
    assert result.status == "done", result.finished.error
    assert "tensorflow" not in sys.modules
    [profile] = [event for event in result.of_type(Artifact) if event.kind == "profile"]
    traces = list(Path(profile.path).glob("*.xplane.pb"))
    assert traces and all(trace.stat().st_size > 0 for trace in traces)
    assert Path(profile.path).is_relative_to(result.run.run_dir / "profile" / "plugins" / "profile")
    assert not [line for line in result.logs() if "cannot profile" in line]


def test_profile_steps_outside_tpudash_trace_with_jax_profiler(tmp_path):
    # A job run without tpudash's runner (no profile responder) traces profile_steps itself, with JAX's profiler.
    import jax
    import jax.numpy as jnp

    from jobs.trainplan import ProfileWindow

    logs: list[str] = []
    artifacts: list = []
    context = type("Context", (), {"log": lambda self, text, level="info": logs.append(text), "emit": artifacts.append})
    window = ProfileWindow(context(), (2, 3), tmp_path, framework="jax")
    square = jax.jit(lambda x: x @ x)
    for step in range(1, 5):
        window.before(step, step)
        square(jnp.ones((32, 32))).block_until_ready()
        window.after(step)
    window.finish(4)
    assert window.trace_dir is not None and list(window.trace_dir.glob("*.xplane.pb"))
    assert [artifact.path for artifact in artifacts] == [str(window.trace_dir)]
    assert any(line.startswith("profiler trace of steps 2-3") for line in logs)


def test_the_engines_train_job_on_jax_keeps_its_advice_and_mfu_against_the_matmul_check(run_job, store):
    from tpudash.advice.report import read_report

    # The CPU's peak is what the newest matmul check on this host measured (there is no datasheet for a CPU).
    assert run_job("matmul", m=256, k=256, n=256, repeats=2).status == "done"
    result = run_job("train", epochs=2, **SMALL)
    assert result.status == "done", result.finished.error
    meta = json.loads((result.run.run_dir / "run.json").read_text())
    assert meta["runtime"]["backend"] == "jax" and meta["runtime"]["mfu_peak"]["flops_per_second"] > 0
    mfu = meta["summary"]["mfu"]
    assert mfu["flops_per_step"] > 0 and "lowered by JAX" in mfu["flops_source"], mfu
    assert 0 < mfu["mfu"] < 1, mfu
    report = read_report(store.files(result.run.run_id))
    assert report is not None and report.framework == "jax"
    small = report.rule("small-batch")
    assert small.state == "fires" and small.detail["batch_per_core"] == 8


def test_several_workers_on_jax_are_refused_saying_why_before_anything_starts(run_job, store):
    # Workers are TensorFlow's (TF_CONFIG); on JAX one process drives every device of the host.
    result = run_job("train", epochs=1, workers=2, **SMALL)
    assert result.status == "failed"
    assert result.finished.error.startswith("ParamError: workers: 2 worker processes train under TensorFlow's")
    assert "allowed on JAX: 1" in result.finished.error
    assert store.list_runs() == []
