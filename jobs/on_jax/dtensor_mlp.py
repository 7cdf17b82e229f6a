"""The ``dtensor-mlp`` job on JAX: the same MLP, params and reports, its arrays laid out by ``NamedSharding``.

DTensor's counterpart in JAX is a ``jax.sharding.Mesh`` with named axes and
arrays placed on it by ``NamedSharding``; ``jax.jit`` then partitions the
step over the devices (GSPMD) and inserts the collectives, as DTensor's
layouts do. The mesh is (batch, model) over the runtime's devices: on an
even count of two or more, ``model`` is 2 and ``batch`` the rest (8 CPU
devices: batch=4, model=2). Every batch is split along ``batch`` (as the
TensorFlow job splits it over its ``batch`` axis); every kernel's output
columns and its bias are split along ``model`` when they divide evenly
(replicated otherwise), and replicated along ``batch``. So each device holds
half of every layer and a quarter of every batch; the tables say so, read
from the arrays' own shards.

The model, initialisation rule (Xavier uniform, zero biases), loss, accuracy
and hand-written Adam are the TensorFlow job's (``jobs.dtensor_mlp``); the
data are the same NumPy splits, reshuffled every epoch by a seeded
permutation. Events and summary come from the shared ``EpochReports``.
JAX is imported inside functions only.
"""

from __future__ import annotations

import math
from typing import Any

from jobs import datasets as data
from jobs.dtensor_mlp import EpochReports, device_table, held_text, layer_table, load_data

BATCH_AXIS = "batch"
MODEL_AXIS = "model"
ADAM = {"beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7}
"""The DTensor MNIST example's Adam constants (``jobs.dtensor_mlp.Adam``'s defaults)."""


def mesh_shape(devices: int) -> tuple[int, int]:
    """(batch, model): the model axis is 2 where the devices pair up, else 1 (all batch)."""
    model = 2 if devices >= 2 and devices % 2 == 0 else 1
    return devices // model, model


def run_dtensor_mlp_jax(ctx: Any, params: dict) -> dict:
    """The ``dtensor-mlp`` job's JAX runner (``JobSpec.run_jax``)."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    devices = list(ctx.runtime.logical_devices)
    batch_axis, model_axis = mesh_shape(len(devices))
    mesh = Mesh(np.array(devices).reshape(batch_axis, model_axis), (BATCH_AXIS, MODEL_AXIS))
    mesh_text = f"{BATCH_AXIS}={batch_axis},{MODEL_AXIS}={model_axis}"
    splits, sizes, train_steps, _ = load_data(ctx, params, tf_data=False)
    batch_size = params["batch_size"]

    def split_columns(width: int) -> bool:
        return model_axis > 1 and width % model_axis == 0

    layouts = [(P(None, MODEL_AXIS), P(MODEL_AXIS)) if split_columns(fan_out) else (P(), P()) for fan_out in sizes[1:]]
    shardings = [tuple(NamedSharding(mesh, spec) for spec in layout) for layout in layouts]
    weights = initial_weights(jax, sizes, params["seed"], shardings)
    zeros = [
        tuple(jax.device_put(np.zeros(part.shape, np.float32), part.sharding) for part in layer) for layer in weights
    ]
    optimizer = {"v": zeros, "s": [tuple(part.copy() for part in layer) for layer in zeros], "t": np.float32(1.0)}
    parameter_count = sum(fan_in * fan_out + fan_out for fan_in, fan_out in zip(sizes, sizes[1:]))

    layout_texts = [
        f"columns split over {MODEL_AXIS} ({model_axis}), replicated over {BATCH_AXIS}"
        if split_columns(fan_out)
        else "replicated"
        for fan_out in sizes[1:]
    ]
    held = [
        held_text(kernel.addressable_shards[0].data.shape, bias.addressable_shards[0].data.shape)
        for kernel, bias in weights
    ]
    ctx.emit(
        layer_table(
            f"JAX NamedSharding MLP on {splits.label}: {parameter_count:,} params, mesh {mesh_text}",
            sizes,
            layout_texts,
            held,
        )
    )
    ctx.emit(device_table(mesh_text, device_rows(mesh, weights, batch_size // batch_axis)))
    ctx.log(
        f"JAX NamedSharding: mesh [('{BATCH_AXIS}', {batch_axis}), ('{MODEL_AXIS}', {model_axis})] over "
        f"{len(devices)} {ctx.runtime.kind} devices; each batch of {batch_size} split into {batch_axis} shards of "
        f"{batch_size // batch_axis}, every layer's columns into {model_axis}; {' → '.join(map(str, sizes))} on "
        f"{splits.label}, {splits.train_examples:,} train / {splits.test_examples:,} test examples"
    )
    train_step, test_step = step_functions(jax, params["learning_rate"])
    inputs = (NamedSharding(mesh, P(BATCH_AXIS, None)), NamedSharding(mesh, P(BATCH_AXIS)))
    train_images, train_labels = splits.train
    test_images, test_labels = splits.test

    def batch_at(images, labels, chosen):
        x = data.scaled_images(images[chosen]).reshape(len(chosen), -1)
        return jax.device_put(x, inputs[0]), jax.device_put(labels[chosen].astype(np.int32), inputs[1])

    reports = EpochReports(ctx, params["epochs"], train_steps)
    for epoch in range(1, params["epochs"] + 1):
        reports.begin_epoch()
        order = np.random.default_rng([params["seed"], epoch]).permutation(len(train_labels))
        for step in range(1, train_steps + 1):
            x, y = batch_at(train_images, train_labels, order[(step - 1) * batch_size : step * batch_size])
            weights, optimizer, loss, accuracy = train_step(weights, optimizer, x, y)
            reports.batch(epoch, step, float(loss), float(accuracy))
        for start in range(0, len(test_labels) - batch_size + 1, batch_size):
            loss, accuracy = test_step(
                weights, *batch_at(test_images, test_labels, np.arange(start, start + batch_size))
            )
            reports.test_batch(float(loss), float(accuracy))
        reports.end_epoch(epoch)
    return reports.summary(splits, mesh_text, sizes, parameter_count)


def initial_weights(jax, sizes: list[int], seed: int, shardings: list) -> list:
    """Xavier uniform kernels and zero biases, as the TensorFlow job draws them, placed by their shardings."""
    import numpy as np

    weights = []
    for index, (fan_in, fan_out) in enumerate(zip(sizes, sizes[1:])):
        limit = math.sqrt(6.0) / math.sqrt(fan_in + fan_out)
        # Seeded by (seed, layer) as the TensorFlow job's stateless draw is; another generator, other numbers.
        key = jax.random.fold_in(jax.random.key(seed), index + 23)
        kernel = jax.random.uniform(key, (fan_in, fan_out), minval=-limit, maxval=limit, dtype=np.float32)
        kernel_sharding, bias_sharding = shardings[index]
        weights.append(
            (jax.device_put(kernel, kernel_sharding), jax.device_put(np.zeros(fan_out, np.float32), bias_sharding))
        )
    return weights


def step_functions(jax, learning_rate: float):
    """The jitted train and test steps: cross-entropy, accuracy, and the example's Adam (bias-corrected by t)."""
    import jax.numpy as jnp

    def forward(weights, x):
        for index, (kernel, bias) in enumerate(weights):
            x = x @ kernel + bias
            if index < len(weights) - 1:
                x = jax.nn.relu(x)
        return x

    def loss_and_accuracy(weights, x, y):
        logits = forward(weights, x)
        loss = jnp.mean(jax.nn.logsumexp(logits, axis=-1) - jnp.take_along_axis(logits, y[:, None], axis=-1)[:, 0])
        return loss, jnp.mean((jnp.argmax(logits, axis=-1) == y).astype(jnp.float32))

    @jax.jit
    def train_step(weights, optimizer, x, y):
        (loss, accuracy), grads = jax.value_and_grad(loss_and_accuracy, has_aux=True)(weights, x, y)
        beta_1, beta_2, epsilon, t = ADAM["beta_1"], ADAM["beta_2"], ADAM["epsilon"], optimizer["t"]
        v = jax.tree.map(lambda v, g: beta_1 * v + (1 - beta_1) * g, optimizer["v"], grads)
        s = jax.tree.map(lambda s, g: beta_2 * s + (1 - beta_2) * jnp.square(g), optimizer["s"], grads)
        weights = jax.tree.map(
            lambda w, v, s: w - learning_rate * ((v / (1 - beta_1**t)) / (jnp.sqrt(s / (1 - beta_2**t)) + epsilon)),
            weights,
            v,
            s,
        )
        return weights, {"v": v, "s": s, "t": t + 1.0}, loss, accuracy

    @jax.jit
    def test_step(weights, x, y):
        return loss_and_accuracy(weights, x, y)

    return train_step, test_step


def device_rows(mesh, weights: list, examples: int) -> list[list]:
    """One row per device: its (batch, model) position, the examples it computes, and the weight shards it holds."""
    held: dict[Any, tuple[int, int]] = {}
    for layer in weights:
        for part in layer:
            for shard in part.addressable_shards:
                count, size = held.get(shard.device, (0, 0))
                held[shard.device] = (count + shard.data.size, size + shard.data.size * shard.data.dtype.itemsize)
    rows = []
    for (batch_index, model_index), device in sorted(
        ((position, device) for position, device in _positions(mesh)), key=lambda item: item[1].id
    ):
        count, size = held.get(device, (0, 0))
        name = f"{device.platform.upper()}:{device.id}"
        rows.append([name, f"batch {batch_index}, model {model_index}", examples, count, size])
    return rows


def _positions(mesh):
    rows, columns = mesh.devices.shape
    for batch_index in range(rows):
        for model_index in range(columns):
            yield (batch_index, model_index), mesh.devices[batch_index, model_index]
