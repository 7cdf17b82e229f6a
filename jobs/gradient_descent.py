"""Gradient descent on one device: does autodiff plus an optimizer work there?

The Colab TPU walkthrough's experiment: minimise x0² + x1² from [1, 4] with Keras SGD
(learning rate 0.1), 20 steps of a ``tf.function`` training step whose
variable lives on the first device. With the defaults the job prints exactly
the walkthrough's line, ``0.0022596875205636024 @ [0.01152921 0.04611686]``. The
objective (or Rosenbrock's valley), the optimizer, the learning rate, the
number of steps, the start point and the device can all be changed. The job
reports the loss and the point (x0, x1) at the start (step 0) and after every
step, so the path can be plotted from where it began.

On JAX (``jobs.on_jax.gradient_descent``) the same Keras optimizer steps a
jitted ``jax.grad`` of the same objective, and prints the same line; both
runners report through ``descend`` and ``finish``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from jobs.base import JobSpec, Param, ParamError
from jobs.events import Metric

OBJECTIVES = ("quadratic", "rosenbrock")
OPTIMIZERS = ("sgd", "momentum", "adam")


class Diverged(RuntimeError):
    """The loss or the point stopped being a finite number."""


def quadratic(params):
    """The walkthrough's objective, x0² + x1², written exactly as it does."""
    loss = params[0] ** 2 + params[1] ** 2
    return loss


def rosenbrock(params):
    """Rosenbrock's banana valley, (1 − x0)² + 100 (x1 − x0²)²; minimum 0 at [1, 1]."""
    return (1 - params[0]) ** 2 + 100 * (params[1] - params[0] ** 2) ** 2


def make_optimizer(tf: Any, name: str, learning_rate: float, momentum: float):
    if name == "sgd":
        return tf.keras.optimizers.SGD(learning_rate=learning_rate)
    if name == "momentum":
        return tf.keras.optimizers.SGD(learning_rate=learning_rate, momentum=momentum)
    return tf.keras.optimizers.Adam(learning_rate=learning_rate)


def _check_runtime(params: dict, runtime: Any) -> None:
    count = len(runtime.logical_devices)
    if params["device"] >= count:
        raise ParamError(
            "device", f"{params['device']} is out of range; this session has {count} devices (0-{count - 1})"
        )


def objective_for(params: dict):
    """The objective the params name: one function for the device (a tensor, a JAX array) and the report."""
    return quadratic if params["objective"] == "quadratic" else rosenbrock


def walkthrough_line(loss: Any, point: Any) -> str:
    """The walkthrough's ``print(f"{loss} @ {x}")``: a float32 loss and point as NumPy prints them.

    ``0.0022596875205636024 @ [0.01152921 0.04611686]``: the loss, a float32
    scalar, prints as the float64 it widens to; the point as a float32 array.
    """
    import numpy as np

    return f"{np.float32(loss)} @ {np.asarray(point, dtype=np.float32)}"


def descend(ctx, params: dict, device_name: str, take_step: Callable[[], None], current: Callable) -> None:
    """The run on any framework: ``take_step()`` makes one optimizer step; ``current()`` is (loss, point) now.

    Reports the start (step 0) and the point after every step, honours
    cancel between steps, and fails the run when the loss or point stops
    being finite (``Diverged``, with advice; nothing infinite is plotted).
    """
    steps = params["steps"]

    def report(step: int) -> None:
        """Metrics for the point after ``step`` updates (step 0: the start, so the path begins there)."""
        loss, point = current()
        loss = float(loss)
        x0, x1 = (float(value) for value in point)
        if not all(math.isfinite(value) for value in (loss, x0, x1)):
            # Not plotted: an infinite point would flatten every chart.
            message = (
                f"diverged at step {step}: loss {loss}, x = [{x0}, {x1}]; "
                f"try a smaller learning_rate than {params['learning_rate']:g}"
            )
            ctx.log(message, "error")
            raise Diverged(message)
        for name, value in (("loss", loss), ("x0", x0), ("x1", x1)):
            ctx.emit(Metric(name=name, value=value, step=step))

    ctx.log(
        f"{params['objective']} from {list(params['start'])} with {params['optimizer']} "
        f"(learning rate {params['learning_rate']:g}), {steps} steps on {device_name}"
    )
    ctx.progress(0, steps, "step")
    report(0)
    for step in range(1, steps + 1):
        ctx.raise_if_cancelled()
        take_step()
        report(step)
        ctx.progress(step, steps, "step")


def finish(ctx, params: dict, device_name: str, loss: Any, point: Any) -> dict:
    """The walkthrough's line in the log, and the summary: where the descent ended."""
    line = walkthrough_line(loss, point)
    ctx.log(line)
    return {
        "loss": float(loss),
        "x": [float(value) for value in point],
        "start": list(params["start"]),
        "line": line,
        "steps": params["steps"],
        "device": device_name,
    }


def run(ctx, params: dict) -> dict:
    import tensorflow as tf

    objective = objective_for(params)
    optimizer = make_optimizer(tf, params["optimizer"], params["learning_rate"], params["momentum"])
    device = ctx.runtime.logical_devices[params["device"]]

    # The walkthrough's training step, unchanged: the printed digits depend on it.
    @tf.function
    def training_step(params: tf.Variable) -> None:
        with tf.GradientTape() as t:
            loss = objective(params)
        grads = t.gradient(loss, params)
        optimizer.apply_gradients([(grads, params)])

    tensor = tf.constant(list(params["start"]), dtype=tf.float32)
    with tf.device(device.name):
        variable = tf.Variable(tensor, trainable=True)
        descend(
            ctx,
            params,
            device.name,
            lambda: training_step(variable),
            lambda: (objective(variable).numpy(), variable.numpy()),
        )
    # Evaluated outside the device scope, as the walkthrough prints it.
    return finish(ctx, params, device.name, objective(variable).numpy(), variable.numpy())


SPECS = (
    JobSpec(
        name="gradient-descent",
        title="Gradient descent",
        description=(
            "Minimise x0² + x1² (or Rosenbrock) on one device with a Keras optimizer in a tf.function "
            "step (jax.jit on JAX; the Colab TPU walkthrough); loss and (x0, x1) per step. Defaults print "
            "0.0022596875205636024 @ [0.01152921 0.04611686]."
        ),
        params=(
            Param(
                "objective",
                "str",
                "quadratic",
                "quadratic: x0² + x1²; rosenbrock: (1 − x0)² + 100 (x1 − x0²)²",
                choices=OBJECTIVES,
            ),
            Param("optimizer", "str", "sgd", "sgd, momentum (SGD with momentum) or adam", choices=OPTIMIZERS),
            Param("learning_rate", "float", 0.1, "step size", minimum=0.0, minimum_exclusive=True, maximum=100.0),
            Param(
                "momentum",
                "float",
                0.9,
                "momentum of optimizer=momentum",
                minimum=0.0,
                maximum=0.999,
                applies_when=("optimizer", ("momentum",)),
            ),
            Param("steps", "int", 20, "optimizer steps", minimum=1, maximum=100_000),
            Param("start", "floats", (1.0, 4.0), "starting point x0,x1", length=2),
            Param("device", "int", 0, "index of the logical device to run on", minimum=0),
        ),
        run=run,
        run_jax="jobs.on_jax.gradient_descent:run",
        key="g",
        check_runtime=_check_runtime,
    ),
)
