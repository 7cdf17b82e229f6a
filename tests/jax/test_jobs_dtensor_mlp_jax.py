"""The ``dtensor-mlp`` job on JAX (no TensorFlow): the DTensor example's MLP on a (batch, model) ``NamedSharding`` mesh.

The same params, events and summary as the TensorFlow job (tests/unit/test_dtensor_mlp.py), and what
each of the 8 CPU devices holds: half of every layer's columns, a quarter of every batch.
"""

from __future__ import annotations

import sys

import pytest

pytest.importorskip("jax")


SMALL = dict(source="synthetic", limit_train=512, limit_test=128, batch_size=64, hidden="64,32")


@pytest.fixture(scope="module")
def runtime():
    """JAX's runtime over the 8 CPU devices, detected once for this module (the TensorFlow one is never built)."""
    from tpudash.accel.jaxdetect import detect_jax

    return detect_jax(8, use_tpu=False)


def epoch_values(result, name, split):
    return [metric.value for metric in result.metrics(name, split)]


def test_trains_over_a_batch_model_mesh_its_loss_falls_and_each_device_holds_its_shards(run_job):
    result = run_job("dtensor-mlp", epochs=3, **SMALL)
    assert result.status == "done", result.finished.error
    assert "tensorflow" not in sys.modules
    train_losses = epoch_values(result, "loss", "train")
    assert len(train_losses) == 3 and train_losses[-1] < train_losses[0]
    assert len(epoch_values(result, "loss", "test")) == 3
    assert all(0.0 <= value <= 1.0 for value in epoch_values(result, "accuracy", "test"))
    # 512 examples in batches of 64: 8 steps an epoch, a training loss for each.
    assert [metric.step for metric in result.metrics("batch_loss")] == list(range(1, 25))
    sizes = [784, 64, 32, 10]
    summary = result.summary
    assert (summary["mesh"], summary["layers"], summary["steps"]) == ("batch=4,model=2", sizes, 24)
    assert summary["params"] == sum(a * b + b for a, b in zip(sizes, sizes[1:]))
    layers, devices = result.tables()
    # Every layer's output columns split over model (2), replicated over batch: half a layer per device.
    assert [row[1] for row in layers.rows[:-1]] == ["784→64", "64→32", "32→10"]
    assert {row[2] for row in layers.rows[:-1]} == {"columns split over model (2), replicated over batch"}
    assert [row[4] for row in layers.rows[:-1]] == ["784×32 + 32", "64×16 + 16", "32×5 + 5"]
    assert layers.rows[-1][3] == summary["params"]
    assert [row[0] for row in devices.rows] == [f"CPU:{index}" for index in range(8)]
    assert [row[1] for row in devices.rows[:3]] == ["batch 0, model 0", "batch 0, model 1", "batch 1, model 0"]
    half = (784 * 32 + 32) + (64 * 16 + 16) + (32 * 5 + 5)
    assert all(row[2:] == [16, half, 4 * half] for row in devices.rows)  # 64 examples over 4 batch shards
    assert 2 * half == summary["params"]
    assert any("mesh [('batch', 4), ('model', 2)]" in line for line in result.logs())


def test_cancel_stops_between_batches(run_job):
    from tests.unit.test_dtensor_mlp import run_cancelled_at_the_third_batch

    run_cancelled_at_the_third_batch(run_job, **SMALL)
