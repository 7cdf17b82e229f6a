"""The ``dtensor-mlp`` job (the DTensor MNIST example): data parallelism over a DTensor mesh of the 8 logical CPUs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from jobs import get_job
from jobs.base import ParamError
from jobs.dtensor_mlp import DTensorUnavailable, build_mlp, make_mesh

SMALL = dict(source="synthetic", limit_train=512, limit_test=256, batch_size=64)


def epoch_values(result, name, split):
    return [metric.value for metric in result.metrics(name, split)]


def test_trains_the_seed_mlp_over_a_batch_mesh_and_its_loss_falls(run_job, runtime):
    result = run_job("dtensor-mlp", epochs=3, **SMALL)
    assert result.status == "done", result.finished.error
    train_losses = epoch_values(result, "loss", "train")
    assert len(train_losses) == 3 and train_losses[-1] < train_losses[0]
    assert len(epoch_values(result, "loss", "test")) == 3
    assert all(0.0 <= value <= 1.0 for value in epoch_values(result, "accuracy", "test"))
    # The architecture the seed meant: 784→700→500→10, every weight replicated.
    table, devices = result.tables()
    sizes = [784, 700, 500, 10]
    expected_params = sum(a * b + b for a, b in zip(sizes, sizes[1:]))
    assert [row[1] for row in table.rows[:-1]] == ["784→700", "700→500", "500→10"]
    assert {row[2] for row in table.rows[:-1]} == {"replicated"}
    assert table.rows[-1][3] == result.summary["params"] == expected_params
    # What each device holds, read from the DVariables: a whole copy of every layer, an eighth of every batch.
    assert [row[4] for row in table.rows[:-1]] == ["784×700 + 700", "700×500 + 500", "500×10 + 10"]
    assert len(devices.rows) == 8 and [row[1] for row in devices.rows[:2]] == ["batch 0", "batch 1"]
    assert all(row[2:] == [8, expected_params, 4 * expected_params] for row in devices.rows)
    assert result.summary["mesh"] == f"batch={runtime.num_replicas}"
    assert result.summary["layers"] == sizes
    # 512 examples in batches of 64: 8 steps an epoch, a training loss for each.
    assert [metric.step for metric in result.metrics("batch_loss")] == list(range(1, 25))
    assert any("mesh [('batch', 8)]" in line and "shards of 8" in line for line in result.logs())


def test_reads_mnist_through_tfds(run_job):
    tfds = pytest.importorskip("tensorflow_datasets")
    with tfds.testing.mock_data(num_examples=128):
        result = run_job(
            "dtensor-mlp", source="tfds", epochs=1, hidden="32", batch_size=64, limit_train=0, limit_test=0
        )
    assert result.status == "done", result.finished.error
    assert result.summary["data"] == "MNIST from tfds"
    assert result.summary["layers"] == [784, 32, 10]


def test_cancel_stops_between_batches(run_job):
    def cancel_at_third_batch(run, event):
        if getattr(event, "name", None) == "batch_loss" and event.step == 3:
            run.cancel_event.set()

    result = run_job("dtensor-mlp", on_event=cancel_at_third_batch, epochs=2, **SMALL)
    assert result.status == "cancelled"
    assert [metric.step for metric in result.metrics("batch_loss")] == [1, 2, 3]


@pytest.mark.parametrize(
    ("overrides", "field"),
    [({"batch_size": "100"}, "batch_size"), ({"limit_train": "32"}, "limit_train")],
)
def test_batches_that_do_not_fit_the_mesh_are_refused(overrides, field):
    spec = get_job("dtensor-mlp")
    params = spec.resolve(overrides)
    runtime = SimpleNamespace(num_replicas=8, logical_devices=[object()] * 8)
    with pytest.raises(ParamError) as raised:
        spec.check_runtime(params, runtime)
    assert raised.value.field == field


@pytest.mark.parametrize(
    ("field", "value"),
    [("hidden", "0"), ("hidden", "a,b"), ("learning_rate", "0"), ("dataset", "svhn"), ("epochs", "0")],
)
def test_bad_params_are_refused_naming_the_field(field, value):
    with pytest.raises(ParamError) as raised:
        get_job("dtensor-mlp").resolve({field: value})
    assert raised.value.field == field


def test_a_runtime_without_devices_is_refused_clearly():
    with pytest.raises(DTensorUnavailable, match="no logical devices"):
        make_mesh(SimpleNamespace(logical_devices=[], kind="CPU", num_replicas=0))


def test_a_mesh_that_cannot_hold_variables_fails_with_the_reason(runtime):
    # TPU device names with no TPU behind them: the mesh is only a
    # description, placing the weights is where DTensor finds out.
    fake_tpu = SimpleNamespace(
        logical_devices=[SimpleNamespace(name=f"/device:TPU:{index}") for index in range(8)], kind="TPU", num_replicas=8
    )
    dtensor, mesh = make_mesh(fake_tpu)
    with pytest.raises(DTensorUnavailable) as raised:
        build_mlp(fake_tpu, dtensor, mesh, [4, 3, 2], seed=1)
    message = str(raised.value)
    assert message.startswith("DTensor cannot place replicated variables on this runtime's 8 TPU devices")
    assert "TPU VM" in message and "\n" not in message
