"""The ``dtensor-mlp`` job (the DTensor MNIST example): data parallelism over a DTensor mesh of the 8 logical CPUs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from jobs import get_job
from jobs.base import ParamError
from jobs.dtensor_mlp import (
    Adam,
    DTensorUnavailable,
    build_mlp,
    first_component,
    make_mesh,
    repack_local_tensor,
    training_step,
)

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


def run_cancelled_at_the_third_batch(run_job, **params):
    """dtensor-mlp cancelled when its third batch reports: it stops there, the batches so far kept."""

    def cancel_at_third_batch(run, event):
        if getattr(event, "name", None) == "batch_loss" and event.step == 3:
            run.cancel_event.set()

    result = run_job("dtensor-mlp", on_event=cancel_at_third_batch, epochs=2, **params)
    assert result.status == "cancelled"
    assert [metric.step for metric in result.metrics("batch_loss")] == [1, 2, 3]
    return result


def test_cancel_stops_between_batches(run_job):
    run_cancelled_at_the_third_batch(run_job, **SMALL)


def test_a_training_step_on_the_mesh_moves_every_weight_as_plain_tensorflow_does(runtime):
    # The job reproduces the example's training only if one step over the batch mesh (gradients
    # reduced over the 8 shards, the example's Adam) gives the weights one plain TensorFlow step
    # on the whole batch gives; a step that drops a layer's update learns visibly slower.
    import numpy as np
    import tensorflow as tf

    dtensor, mesh = make_mesh(runtime)
    model = build_mlp(runtime, dtensor, mesh, [12, 8, 6, 4], seed=22)
    learning_rate, beta_1, beta_2, epsilon = 0.001, 0.9, 0.999, 1e-7
    train_step = training_step(tf, model, Adam(dtensor, model.trainable_variables, learning_rate=learning_rate))
    generator = np.random.default_rng(5)
    images = generator.random((16, 12), dtype=np.float32)
    labels = generator.integers(0, 4, 16).astype(np.int64)
    weights = [first_component(dtensor, variable).numpy() for variable in model.trainable_variables]

    expected = [tf.Variable(value) for value in weights]
    with tf.GradientTape() as tape:
        activations = tf.constant(images)
        for index in range(0, len(expected), 2):
            activations = tf.matmul(activations, expected[index]) + expected[index + 1]
            if index < len(expected) - 2:
                activations = tf.nn.relu(activations)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=activations))
    for variable, gradient in zip(expected, tape.gradient(loss, expected)):
        # Adam's first step, bias-corrected at t = 1: each weight moves by about learning_rate.
        moment = (1 - beta_1) * gradient / (1 - beta_1)
        second_moment = (1 - beta_2) * tf.square(gradient) / (1 - beta_2)
        variable.assign_sub(learning_rate * moment / (tf.sqrt(second_moment) + epsilon))

    batch_loss, _ = train_step(
        repack_local_tensor(dtensor, tf, images, dtensor.Layout(["batch", dtensor.UNSHARDED], mesh)),
        repack_local_tensor(dtensor, tf, labels, dtensor.Layout(["batch"], mesh)),
    )
    assert float(dtensor.unpack(batch_loss)[0]) == pytest.approx(float(loss), rel=1e-6)
    for variable, want, before in zip(model.trainable_variables, expected, weights):
        got = first_component(dtensor, variable).numpy()
        moved = float(np.abs(got - before).max())
        assert moved > learning_rate / 2, f"the {tuple(variable.shape)} weights moved by {moved} in a step"
        np.testing.assert_allclose(got, want.numpy(), rtol=0, atol=1e-6)


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
