"""FLOPs per step of a JAX MLP from XLA's cost analysis, against a count by hand, and its MFU."""

from __future__ import annotations

import time

import pytest

from tpudash.advice.flops import step_flops_jax, step_flops_keras_jax
from tpudash.advice.mfu import Mfu, PeakFlops, measured_peak_flops, mfu

BATCH, INPUTS, HIDDEN, OUTPUTS = 128, 256, 512, 10


def mlp_step():
    """One SGD step of a two-layer MLP (Dense 256→512, relu, Dense 512→10, softmax cross-entropy), jitted."""
    import jax
    import jax.numpy as jnp

    def loss(params, x, y):
        hidden = jax.nn.relu(x @ params["w1"] + params["b1"])
        logits = hidden @ params["w2"] + params["b2"]
        return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * y, axis=-1))

    @jax.jit
    def step(params, x, y):
        grads = jax.grad(loss)(params, x, y)
        return jax.tree_util.tree_map(lambda weight, grad: weight - 0.1 * grad, params, grads)

    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    params = {
        "w1": jax.random.normal(keys[0], (INPUTS, HIDDEN)) * 0.05,
        "b1": jnp.zeros(HIDDEN),
        "w2": jax.random.normal(keys[1], (HIDDEN, OUTPUTS)) * 0.05,
        "b2": jnp.zeros(OUTPUTS),
    }
    x = jnp.ones((BATCH, INPUTS))
    y = jax.nn.one_hot(jnp.arange(BATCH) % OUTPUTS, OUTPUTS)
    return step, params, x, y


def matmul_flops_by_hand(batch: int) -> int:
    """2 FLOPs per multiply-add of the step's matrix products.

    Forward: x·W1 and h·W2. Backward: the weights' gradients (xᵀ·dh, hᵀ·dlogits) cost the forward again, and
    the hidden layer's gradient (dlogits·W2ᵀ) the second product once more; x needs none (not a parameter).
    So 3 × forward − the first product.
    """
    first, second = 2 * batch * INPUTS * HIDDEN, 2 * batch * HIDDEN * OUTPUTS
    return 3 * (first + second) - first


def test_xla_counts_the_mlp_step_as_the_hand_count_plus_its_elementwise_ops():
    step, params, x, y = mlp_step()
    count = step_flops_jax(step, params, x, y)
    assert count.source == "XLA cost analysis of the compiled step"
    hand = matmul_flops_by_hand(BATCH)  # 71,041,024
    # XLA also counts every elementwise op, 1 FLOP per element: the bias adds, relu and its gradient (≈4 per
    # hidden unit and example), the softmax and loss (≈10 per logit), the SGD update (2 per weight): about
    # 0.55 MFLOP here, 0.8 % of the products. So XLA's count is the hand count plus at most 2 %.
    assert hand <= count.flops <= 1.02 * hand


def test_a_step_sharded_over_8_devices_counts_the_whole_batch():
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    step, params, x, y = mlp_step()
    assert jax.device_count() == 8
    one_device = step_flops_jax(step, params, x, y).flops
    mesh = Mesh(np.array(jax.devices()), ("batch",))
    x, y = (jax.device_put(array, NamedSharding(mesh, P("batch"))) for array in (x, y))
    count = step_flops_jax(step, params, x, y)
    # XLA's cost analysis of a partitioned program is one device's share; the count is of the whole step.
    assert "per device × 8 devices" in count.source
    # The batch's work is split, not repeated; what every device repeats is the update of the replicated
    # weights and the sums of the gradients' all-reduce: a few FLOPs per weight and device (3 at most).
    weights = sum(int(np.prod(weight.shape)) for weight in params.values())
    assert one_device is not None and one_device <= count.flops <= one_device + 8 * 3 * weights


def test_a_plain_function_is_jitted_and_one_that_does_not_compile_says_why():
    import jax.numpy as jnp

    count = step_flops_jax(lambda a, b: a @ b, jnp.ones((4, 8)), jnp.ones((8, 2)))
    assert count.flops == 2 * 4 * 8 * 2
    broken = step_flops_jax(lambda a, b: a @ b, jnp.ones((4, 8)), jnp.ones((3, 2)))
    assert broken.flops is None and broken.source.startswith("JAX could not compile the step: TypeError")


def test_mfu_of_the_mlp_against_a_measured_peak():
    import jax
    import jax.numpy as jnp

    step, params, x, y = mlp_step()
    count = step_flops_jax(step, params, x, y)
    # The host's matmul peak, measured here the way the matmul check measures it (a product timed on one device).
    a = jnp.ones((512, 512))
    product = jax.jit(lambda a: a @ a)
    product(a).block_until_ready()
    started = time.perf_counter()
    for _ in range(5):
        product(a).block_until_ready()
    gflops = 2 * 512**3 * 5 / (time.perf_counter() - started) / 1e9
    peak = measured_peak_flops(
        {"run_id": "jax-check", "finished": None, "results": {"TFRT_CPU_0": {"passed": True, "gflops": gflops}}}
    )
    assert peak.known and "measured by the matmul check of jax-check" in peak.source
    params = step(params, x, y)  # compiled once, outside the timing
    jax.block_until_ready(params)
    started = time.perf_counter()
    for _ in range(5):
        params = step(params, x, y)
    jax.block_until_ready(params)
    steps_per_second = 5 / (time.perf_counter() - started)
    result = Mfu.of(count, steps_per_second, peak)
    assert result.mfu == pytest.approx(mfu(count.flops, steps_per_second, peak))
    # Work that is all matrix products of the same order as the peak's runs near it; never far above it (a
    # wrong count or a peak per device against the work of all would be off by 8×).
    assert 0 < result.mfu < 3
    assert result.to_json()["peak_source"] == peak.source


def test_an_unknown_peak_leaves_the_mlp_mfu_unknown():
    step, params, x, y = mlp_step()
    result = Mfu.of(step_flops_jax(step, params, x, y), 100.0, PeakFlops(None, "no published peak for 'cpu'"))
    assert result.mfu is None and "no published peak for 'cpu'" in result.why


def keras_mlp():
    import keras

    return keras.Sequential(
        [keras.Input((INPUTS,)), keras.layers.Dense(HIDDEN, activation="relu"), keras.layers.Dense(OUTPUTS)]
    )


def test_a_keras_models_step_on_jax_counts_exactly_its_matrix_products():
    count = step_flops_keras_jax(keras_mlp(), BATCH)
    assert count.flops == matmul_flops_by_hand(BATCH), count.source
    assert "lowered by JAX" in count.source and f"batch {BATCH}" in count.source


def test_a_keras_model_under_data_parallel_counts_the_global_batch():
    import keras

    devices = keras.distribution.list_devices()
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
    try:
        count = step_flops_keras_jax(keras_mlp(), BATCH * len(devices))
    finally:
        keras.distribution.set_distribution(None)
    assert len(devices) == 8 and count.flops == matmul_flops_by_hand(BATCH * 8)


def test_a_keras_model_without_known_inputs_says_why_it_was_not_counted():
    import keras

    count = step_flops_keras_jax(keras.Sequential([keras.layers.Dense(4)]), BATCH)
    assert count.flops is None and count.source.startswith("no batch could be made for the model: ")


def test_the_cifar_cnn_on_jax_counts_what_tensorflow_counts_for_it_the_hand_count():
    # The train job's CIFAR CNN under DataParallel over the 8 devices, as the JAX engine builds it: the same
    # FLOPs per step as on TensorFlow (tests/unit/test_advice_mfu.py), so MFU means the same on both.
    import keras

    from jobs.models import build_model
    from tests.unit.test_advice_mfu import cifar_cnn_train_flops_by_hand

    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=keras.distribution.list_devices()))
    try:
        count = step_flops_keras_jax(build_model("cifar-cnn", (32, 32, 3), 10), 64)
    finally:
        keras.distribution.set_distribution(None)
    assert count.flops == cifar_cnn_train_flops_by_hand(64) == 1_898_790_912
