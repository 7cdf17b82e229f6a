"""Gradient descent on JAX: the Colab TPU walkthrough's experiment with the same Keras optimizer, on one device.

The point lives on the chosen device (``jax.device_put``); one jitted step
takes ``jax.grad`` of the objective and applies the Keras 3 optimizer
statelessly (``optimizer.stateless_apply``, as Keras' own JAX trainer does),
so SGD, momentum and Adam are the very update rules the TensorFlow runner
uses. With the defaults the job prints the walkthrough's line, as TensorFlow
does: ``0.0022596875205636024 @ [0.01152921 0.04611686]``. Reports, cancel,
divergence and the summary are ``jobs.gradient_descent``'s (``descend``,
``finish``).
"""

from __future__ import annotations

from jobs.gradient_descent import descend, finish, objective_for


def make_optimizer(name: str, learning_rate: float, momentum: float):
    """The Keras 3 optimizer the params name (Keras runs on JAX here: ``KERAS_BACKEND=jax``)."""
    import keras

    if name == "sgd":
        return keras.optimizers.SGD(learning_rate=learning_rate)
    if name == "momentum":
        return keras.optimizers.SGD(learning_rate=learning_rate, momentum=momentum)
    return keras.optimizers.Adam(learning_rate=learning_rate)


def run(ctx, params: dict) -> dict:
    """gradient-descent on ``ctx.runtime.logical_devices[params["device"]]``."""
    import jax
    import keras
    import numpy as np

    objective = objective_for(params)
    optimizer = make_optimizer(params["optimizer"], params["learning_rate"], params["momentum"])
    device = ctx.runtime.logical_devices[params["device"]]
    device_name = ctx.runtime.device_names[params["device"]]

    start = keras.Variable(np.array(params["start"], dtype=np.float32), dtype="float32")
    optimizer.build([start])
    state = {
        "point": jax.device_put(start.value, device),
        "optimizer": [jax.device_put(variable.value, device) for variable in optimizer.variables],
    }

    @jax.jit
    def training_step(point, optimizer_variables):
        gradient = jax.grad(objective)(point)
        (point,), optimizer_variables = optimizer.stateless_apply(optimizer_variables, [gradient], [point])
        return point, optimizer_variables

    def take_step() -> None:
        state["point"], state["optimizer"] = training_step(state["point"], state["optimizer"])

    def current():
        point = state["point"]
        return np.asarray(objective(point)), np.asarray(point)

    descend(ctx, params, device_name, take_step, current)
    return finish(ctx, params, device_name, *current())
