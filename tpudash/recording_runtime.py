"""What the user's own process runs on, as a recorded run's runtime: ``session_runtime``.

``tpudash.record`` and ``TpudashCallback`` describe their process once, at
the run's start, in the shape ``Runtime.summary()`` gives jobs: host, pid,
Python, the backend (TensorFlow, or JAX through ``tpudash.accel.jaxruntime``),
the strategy or mesh, the devices. Nothing here imports TensorFlow or JAX:
a framework is described only when the user's process has loaded it, and
describing never raises.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

from tpudash.accel import jaxruntime


def session_runtime(strategy: Any = None, *, backend: str | None = None) -> dict:
    """What the user's process runs on, in the shape ``Runtime.summary()`` gives jobs, with its ``backend``.

    ``strategy``: a ``tf.distribute.Strategy`` (None: the one in scope, when
    TensorFlow is loaded), or, under JAX, a Keras distribution or a
    ``jax.sharding.Mesh`` (``tpudash.accel.jaxruntime``). ``backend``: Keras's
    backend name when the caller knows it; None: JAX when JAX is loaded and
    TensorFlow is not, or when ``strategy`` is JAX's; else TensorFlow when it
    is loaded. Nothing here imports TensorFlow or JAX, and it never raises.
    """
    runtime: dict = {"host": socket.gethostname(), "pid": os.getpid(), "python": sys.version.split()[0]}
    tf = sys.modules.get("tensorflow")
    keras = sys.modules.get("keras")
    if keras is not None:
        runtime["keras"] = getattr(keras, "__version__", None)
    if backend is None:
        if jaxruntime.is_jax_distribution(strategy) or (jaxruntime.loaded_jax() is not None and tf is None):
            backend = "jax"
        elif tf is not None:
            backend = "tensorflow"
        else:
            backend = _keras_backend(keras)
    if backend == "jax":
        runtime.update(jaxruntime.jax_runtime(strategy))
        return runtime
    if tf is None or backend != "tensorflow":
        runtime.update(
            backend=backend if backend in ("tensorflow", "torch") else "unknown",
            kind="unknown",
            strategy=type(strategy).__name__ if strategy is not None else "none",
            num_replicas=1,
        )
        return runtime
    runtime["backend"] = "tensorflow"
    runtime["tensorflow"] = getattr(tf, "__version__", None)
    try:
        strategy = strategy or tf.distribute.get_strategy()
        devices = _strategy_devices(tf, strategy)
        replicas = int(strategy.num_replicas_in_sync)
    except Exception as error:  # noqa: BLE001 - describing must never stop the user's training
        runtime.update(
            kind="unknown", strategy=type(strategy).__name__, num_replicas=1, problem=f"{type(error).__name__}: {error}"
        )
        return runtime
    kind = next((name for name in ("TPU", "GPU") if any(f"{name}:" in device for device in devices)), "CPU")
    runtime.update(
        kind=kind,
        strategy=type(strategy).__name__.lstrip("_"),
        num_replicas=replicas,
        devices=devices,
        # Several replicas on the CPU are logical devices splitting one processor.
        simulated=kind == "CPU" and replicas > 1,
    )
    return runtime


def _keras_backend(keras: Any) -> str:
    """Keras's backend name when Keras is loaded (it may run on torch), else ``unknown``."""
    try:
        return str(keras.backend.backend()) if keras is not None else "unknown"
    except Exception:  # noqa: BLE001 - a half-imported Keras: nothing to say
        return "unknown"


def _strategy_devices(tf: Any, strategy: Any) -> list[str]:
    try:
        return [str(device) for device in strategy.extended.worker_devices]
    except (RuntimeError, AttributeError, NotImplementedError):
        # The default strategy has no device list: it runs where TensorFlow places ops.
        for kind in ("TPU", "GPU", "CPU"):
            devices = tf.config.list_logical_devices(kind)
            if devices:
                return [devices[0].name]
        return []
