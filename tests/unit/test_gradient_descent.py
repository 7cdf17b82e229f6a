"""Gradient descent reproduces the Colab TPU walkthrough's printed line and reports its path per step."""

from __future__ import annotations

import pytest

from jobs import get_job
from jobs.base import ParamError
from jobs.events import Progress
from tpudash.cli import main as cli

WALKTHROUGH_LINE = "0.0022596875205636024 @ [0.01152921 0.04611686]"
# What this job prints on TensorFlow 2.21's CPU for other optimizers and objectives: the JAX runner is held to them
# (tests/jax/test_jobs_checks_jax.py), to float32 rounding.
TENSORFLOW_FIGURES = (
    ({"optimizer": "momentum"}, 2.0736141204833984, [-0.3492525, -1.39701]),
    ({"optimizer": "adam"}, 4.401521682739258, [-0.27115327, 2.080384]),
    (
        {"objective": "rosenbrock", "start": "-1,1", "learning_rate": 0.001, "steps": 50},
        3.8313069343566895,
        [-0.955724, 0.92143995],
    ),
)


def run_dirs(runs_dir):
    return (
        [path for path in runs_dir.iterdir() if path.is_dir() and not path.name.startswith(".")]
        if runs_dir.exists()
        else []
    )


def test_defaults_print_the_walkthroughs_line_exactly(run_job):
    result = run_job("gradient-descent")
    assert result.status == "done"
    assert WALKTHROUGH_LINE in result.logs()
    assert result.summary["line"] == WALKTHROUGH_LINE
    assert result.summary["loss"] == pytest.approx(0.0022596875205636024, rel=1e-12)
    assert result.summary["x"] == pytest.approx([0.01152921, 0.04611686], rel=1e-6)


@pytest.mark.parametrize(("overrides", "loss", "x"), TENSORFLOW_FIGURES)
def test_momentum_adam_and_rosenbrock_end_where_they_always_have(run_job, overrides, loss, x):
    result = run_job("gradient-descent", **overrides)
    assert result.summary["loss"] == pytest.approx(loss, rel=1e-6)
    assert result.summary["x"] == pytest.approx(x, rel=1e-6)


def test_the_start_and_each_step_report_loss_and_the_point(run_job):
    result = run_job("gradient-descent")
    losses = result.metrics("loss")
    x0, x1 = result.metrics("x0"), result.metrics("x1")
    assert [metric.step for metric in losses] == list(range(0, 21))
    assert result.summary["start"] == [1.0, 4.0]
    # Step 0 is the start itself, so a plotted path begins at [1, 4].
    assert (x0[0].step, x0[0].value, x1[0].value, losses[0].value) == (0, 1.0, 4.0, 17.0)
    # SGD on x0² + x1² with lr 0.1 shrinks the point by 0.8 each step.
    assert x0[1].value == pytest.approx(0.8) and x1[1].value == pytest.approx(3.2)
    assert losses[1].value == pytest.approx(0.8**2 * 17)
    assert all(later.value < earlier.value for earlier, later in zip(losses, losses[1:]))
    assert (losses[-1].value, [x0[-1].value, x1[-1].value]) == (result.summary["loss"], result.summary["x"])
    assert [event.done for event in result.of_type(Progress)] == list(range(21))


def test_the_device_start_and_optimizer_can_be_changed(run_job, runtime):
    result = run_job("gradient-descent", optimizer="adam", learning_rate=0.05, steps=30, start="-2,0.5", device=6)
    assert result.status == "done"
    assert result.summary["device"] == runtime.device_names[6]
    assert result.summary["start"] == [-2.0, 0.5]
    losses = result.metrics("loss")
    assert losses[0].value == pytest.approx(2.0**2 + 0.5**2)
    assert result.summary["loss"] < losses[1].value < losses[0].value


def test_momentum_goes_further_than_plain_sgd_in_few_steps(run_job):
    plain = run_job("gradient-descent", learning_rate=0.01, steps=10)
    momentum = run_job("gradient-descent", optimizer="momentum", learning_rate=0.01, steps=10)
    assert momentum.summary["loss"] < plain.summary["loss"]


def test_rosenbrock_descends_with_a_small_step(run_job):
    result = run_job("gradient-descent", objective="rosenbrock", start="-1,1", learning_rate=0.001, steps=50)
    assert result.status == "done"
    starting_loss = (1 - -1) ** 2 + 100 * (1 - (-1) ** 2) ** 2
    losses = result.metrics("loss")
    assert losses[0].value == pytest.approx(starting_loss)
    assert result.summary["loss"] < losses[1].value < starting_loss


def test_divergence_fails_the_run_with_advice_and_plots_no_infinity(run_job):
    result = run_job("gradient-descent", objective="rosenbrock", learning_rate=0.1)
    assert result.status == "failed"
    assert "diverged at step" in result.finished.error and "learning_rate" in result.finished.error
    assert all(abs(metric.value) < float("inf") for metric in result.metrics("loss"))


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"learning_rate": "0"}, "learning_rate"),
        ({"learning_rate": "-0.1"}, "learning_rate"),
        ({"steps": "0"}, "steps"),
        ({"start": "1"}, "start"),
        ({"start": "1,2,3"}, "start"),
        ({"start": "1,nan"}, "start"),
        ({"optimizer": "rmsprop"}, "optimizer"),
        ({"objective": "cubic"}, "objective"),
        ({"device": "-1"}, "device"),
    ],
)
def test_bad_params_are_rejected_naming_the_field(overrides, field):
    with pytest.raises(ParamError) as raised:
        get_job("gradient-descent").resolve(overrides)
    assert raised.value.field == field


def test_a_device_index_out_of_range_exits_2_and_creates_no_run(runtime, isolated_runs_dir, capsys):
    assert cli.main(["run", "gradient-descent", "--set", "device=8"]) == 2
    assert "device: 8 is out of range; this session has 8 devices (0-7)" in capsys.readouterr().err
    assert run_dirs(isolated_runs_dir) == []


def test_cancel_between_steps_is_recorded_as_cancelled(run_job, store):
    def cancel_after_step_3(run, event):
        if isinstance(event, Progress) and event.done == 3:
            run.cancel_event.set()

    result = run_job("gradient-descent", on_event=cancel_after_step_3)
    assert result.status == "cancelled"
    assert store.load(result.run.run_id).info.status == "cancelled"
    assert [metric.step for metric in result.metrics("loss")] == [0, 1, 2, 3]
    assert WALKTHROUGH_LINE not in result.logs()


def test_cancel_on_the_first_progress_event(run_job):
    result = run_job(
        "gradient-descent", on_event=lambda run, event: run.cancel_event.set() if isinstance(event, Progress) else None
    )
    assert result.status == "cancelled"
    # Only the start is reported: no step was taken.
    assert [metric.step for metric in result.metrics("loss")] == [0]


def test_momentum_applies_only_with_the_momentum_optimizer():
    momentum = get_job("gradient-descent").param("momentum")
    assert momentum.applies({"optimizer": "momentum"})
    assert not momentum.applies({"optimizer": "sgd"}) and not momentum.applies({"optimizer": "adam"})
