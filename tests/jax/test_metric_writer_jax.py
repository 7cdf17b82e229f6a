"""``TpudashWriter`` in a JAX loop: what a CLU loop writes (jax scalars from a jitted step) without a sync per write."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from jobs.events import Log, Metric
from tpudash import TpudashWriter
from tpudash.runs.model import RunModel


def only_run(store):
    (run_id,) = store.run_ids()
    return store.load(run_id)


@jax.jit
def train_step(weights, inputs, targets):
    """Linear regression, one step of gradient descent: (new weights, loss, a slow-to-compute metric)."""

    def loss_of(w):
        return jnp.mean((inputs @ w - targets) ** 2)

    loss, grads = jax.value_and_grad(loss_of)(weights)
    busy = inputs.T @ inputs
    for _ in range(3):  # keeps the device busy after the call returns
        busy = jnp.tanh(busy @ busy) * 0.5
    return weights - 0.1 * grads, loss, busy.mean() * 0.0 + loss


def test_a_clu_style_jax_loop_writes_its_run_without_waiting_for_each_step(store):
    inputs = jax.random.normal(jax.random.key(0), (900, 900)) * 0.03
    targets = inputs @ jnp.ones(900)
    weights = jnp.zeros(900)
    jax.block_until_ready(train_step(weights, inputs, targets))  # compiled before the loop

    unfinished_at_write = []
    with TpudashWriter("linear regression", params={"lr": 0.1}) as writer:
        for step in range(3):
            weights, loss, slow_loss = train_step(weights, inputs, targets)
            writer.write_scalars(step, {"train/loss": loss, "eval/loss": slow_loss})
            unfinished_at_write.append(not slow_loss.is_ready())
        writer.write_images(2, {"weights": weights.reshape(30, 30, 1)})  # never read: no wait either
        unfinished_at_write.append(not weights.is_ready())
    assert all(unfinished_at_write)

    data = only_run(store)
    assert data.info.status == "done" and data.info.params == {"lr": 0.1}
    metrics = [event for _, event in data.events if isinstance(event, Metric)]
    assert [(event.name, event.split, event.step) for event in metrics[:2]] == [
        ("loss", "train", 0),
        ("loss", "val", 0),
    ]
    losses = [event.value for event in metrics if event.split == "train"]
    assert len(losses) == 3 and losses[0] > losses[1] > losses[2]  # it learns, and the numbers are the device's
    model = RunModel.from_events(data.events)
    assert model.final_metrics["val_loss"] == pytest.approx(float(loss))
    assert any("does not show images" in event.text for _, event in data.events if isinstance(event, Log))
