"""The matmul check on JAX: the same seeded A·B on every device, checked and timed as ``jobs.matmul`` does it.

Only the framework's part is here (``JaxMatmul``): A and B are cast with
``jnp``, put on each device with ``jax.device_put``, multiplied there by one
jitted ``jnp.matmul`` (a computation follows its committed inputs), and each
timed run ends with ``block_until_ready``. The params, the reference, the
tolerance, the timing loop, the table, the summary and the verdict are
``jobs.matmul.run_check``'s.
"""

from __future__ import annotations

from typing import Any

from jobs.matmul import REDUCED_FLOAT32_INPUT_ROUNDOFF, MatmulFramework, run_check

# jax_default_matmul_precision values that keep float32 inputs whole on every backend.
FULL_FLOAT32_PRECISIONS = ("highest", "float32")


def device_name(device: Any) -> str:
    """``CPU:3``, ``TPU:0``: a JAX device as the runtime's ``device_names`` call it."""
    return f"{str(device.platform).upper()}:{device.id}"


class JaxMatmul(MatmulFramework):
    """A and B on each device in turn, multiplied there by one jitted ``jnp.matmul``."""

    def __init__(self, devices: list):
        import jax
        import jax.numpy as jnp

        self.jax = jax
        self.devices = devices
        self.multiply = jax.jit(jnp.matmul)

    def reduced_float32_input_roundoff(self, kind: str) -> float:
        # JAX's default precision multiplies float32 in one bfloat16 pass on a TPU, in TF32 on a recent GPU.
        precision = self.jax.config.jax_default_matmul_precision
        if kind not in REDUCED_FLOAT32_INPUT_ROUNDOFF or str(precision).lower() in FULL_FLOAT32_PRECISIONS:
            return 0.0
        return REDUCED_FLOAT32_INPUT_ROUNDOFF[kind]

    def full_float32_advice(self, kind: str) -> str:
        return (
            f"JAX's default matmul precision rounds float32 inputs on this {kind}, so the tolerance allows for it "
            '(jax.config.update("jax_default_matmul_precision", "highest") gives full float32)'
        )

    def cast_inputs(self, host_a: Any, host_b: Any, dtype: str) -> tuple[Any, Any, Any, Any]:
        import jax.numpy as jnp
        import numpy as np

        a, b = (jnp.asarray(matrix, dtype=dtype) for matrix in (host_a, host_b))
        return a, b, np.asarray(a).astype(np.float64), np.asarray(b).astype(np.float64)

    def time_on_device(self, index: int, inputs: tuple, timing: Any) -> tuple[float, Any, str]:
        import numpy as np

        device = self.devices[index]
        device_a, device_b = (self.jax.device_put(matrix, device) for matrix in inputs)
        seconds, product = timing(self.multiply, device_a, device_b, lambda product: product.block_until_ready())
        placed_on = ", ".join(sorted(device_name(where) for where in product.devices()))
        return seconds, np.asarray(product).astype(np.float64), placed_on

    def is_out_of_memory(self, error: BaseException) -> bool:
        runtime_error = getattr(self.jax.errors, "JaxRuntimeError", None)
        return runtime_error is not None and isinstance(error, runtime_error) and "RESOURCE_EXHAUSTED" in str(error)


def run(ctx, params: dict) -> dict:
    """``matmul`` on JAX: every chosen device of ``ctx.runtime.logical_devices`` (``jax.devices()``)."""
    devices = list(ctx.runtime.logical_devices)
    return run_check(ctx, params, JaxMatmul(devices), list(ctx.runtime.device_names))
