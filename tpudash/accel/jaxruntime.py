"""A JAX session as tpudash describes it, and JAX values read without importing JAX.

``jax_runtime`` describes what the user's JAX process runs on (its devices,
processes and the Keras distribution or ``jax.sharding.Mesh`` it trains
under) in the runtime dict every run carries (``tpudash.recording.session_runtime``).
The rest lets the recorder take a ``jax.Array`` without waiting for the
device: its shape and dtype are known at once, so a call is checked on the
training thread, and the number is read later, on the recorder's side
(``read_scalar``, ``read_value``); a sharded array or a ``pmap`` output is
split into its addressable shards, one value per device (``replica_shards``).

Nothing here imports JAX: a process that has not loaded it is not using it,
and loading it would take the accelerator. Every function reads
``sys.modules`` and does nothing JAX-specific when JAX is absent.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

# The axis a batch is split over when a Mesh is given without saying which (names JAX's own examples use).
BATCH_AXIS_NAMES = ("batch", "data", "dp")


def loaded_jax() -> Any:
    """The jax module when this process has imported it, else None."""
    return sys.modules.get("jax")


def is_jax_array(value: Any) -> bool:
    """Whether ``value`` is a ``jax.Array`` (a traced one included), without importing JAX."""
    jax = loaded_jax()
    array_type = getattr(jax, "Array", None) if jax is not None else None
    return array_type is not None and isinstance(value, array_type)


def is_traced(value: Any) -> bool:
    """Whether ``value`` is an abstract value inside ``jax.jit``/``grad``: it has no number to read."""
    jax = loaded_jax()
    tracer = getattr(getattr(jax, "core", None), "Tracer", None) if jax is not None else None
    return tracer is not None and isinstance(value, tracer)


def traced_problem(value: Any) -> str | None:
    """Why ``value`` cannot be recorded (it is traced inside a jitted function), or None."""
    if not is_traced(value):
        return None
    return (
        "a traced JAX value (recorded inside jax.jit, grad or vmap, where it has no number yet); "
        "allowed: the concrete array the jitted function returns, recorded after the call"
    )


def scalar_problem(value: Any) -> str | None:
    """Why a jax array is not one number (from its shape and dtype only: no wait for the device), or None."""
    traced = traced_problem(value)
    if traced is not None:
        return traced
    import numpy as np  # JAX depends on it: present whenever a jax array is

    dtype = np.dtype(value.dtype)
    if dtype.kind not in "iuf":
        return f"a JAX array of dtype {dtype.name} is not a number; allowed: a float or integer scalar"
    if value.size != 1:
        return f"a JAX array of shape {tuple(value.shape)} is not a scalar; allowed: shape () or one element"
    return None


def read_scalar(value: Any) -> float:
    """The number in a one-element jax array; waits for the device (call it off the training thread)."""
    import numpy as np

    return float(np.asarray(_addressable(value)).reshape(-1)[0])


def read_value(value: Any) -> Any:
    """A jax array as JSON: one element as a plain number, else nested lists. Waits for the device."""
    import numpy as np

    array = np.asarray(_addressable(value))
    if array.size == 1:
        return array.reshape(-1)[0].item()
    return array.tolist()


def _addressable(value: Any) -> Any:
    # A global array of a multi-process job holds data on other hosts: read this process's first shard.
    if getattr(value, "is_fully_addressable", True):
        return value
    return value.addressable_data(0)


def replica_shards(value: Any) -> tuple[list, list[str]] | None:
    """(one array per addressable shard, its device's name) of a sharded jax array or a ``pmap`` output.

    None when ``value`` is not a jax array. No value is read: the shards are
    arrays on their devices (``read_value`` reads each).
    """
    if not is_jax_array(value) or is_traced(value):
        return None
    shards = list(value.addressable_shards)
    return [shard.data for shard in shards], [str(shard.device) for shard in shards]


# -- the runtime ---------------------------------------------------------------------------------


def is_keras_distribution(strategy: Any) -> bool:
    """A ``keras.distribution`` Distribution (DataParallel, ModelParallel), told apart without importing Keras."""
    return type(strategy).__module__.startswith("keras") and hasattr(strategy, "device_mesh")


def is_jax_mesh(strategy: Any) -> bool:
    jax = loaded_jax()
    mesh_type = getattr(getattr(jax, "sharding", None), "Mesh", None) if jax is not None else None
    return mesh_type is not None and isinstance(strategy, mesh_type)


def is_jax_distribution(strategy: Any) -> bool:
    """Whether ``strategy`` says the session runs on JAX: a Keras distribution or a ``jax.sharding.Mesh``."""
    return strategy is not None and (is_keras_distribution(strategy) or is_jax_mesh(strategy))


def current_keras_distribution() -> Any:
    """The distribution Keras trains under (``keras.distribution.set_distribution``), None without one."""
    keras = sys.modules.get("keras")
    if keras is None:
        return None
    try:
        return keras.distribution.distribution()
    except Exception:  # noqa: BLE001 - a Keras without distributions (another backend): none
        return None


def jax_runtime(distribution: Any = None) -> dict:
    """What a JAX session runs on (the contract's keys; ``tpudash.recording.session_runtime`` adds host and pid).

    ``distribution``: a Keras distribution or a ``jax.sharding.Mesh`` (None:
    Keras's current distribution, when Keras is loaded). Never raises: a
    problem describing it is in ``"problem"``.
    """
    runtime: dict[str, Any] = {"backend": "jax"}
    jax = loaded_jax()
    if jax is None:
        runtime.update(kind="unknown", strategy="none", num_replicas=1, problem="JAX is not loaded in this process")
        return runtime
    runtime["jax"] = getattr(jax, "__version__", None)
    jaxlib = sys.modules.get("jaxlib")
    runtime["jaxlib"] = getattr(jaxlib, "__version__", None) if jaxlib is not None else None
    if distribution is None:
        distribution = current_keras_distribution()
    try:
        devices = list(jax.devices())
        kind = devices[0].platform.upper() if devices else "unknown"
        runtime.update(
            kind=kind,
            device_kind=devices[0].device_kind if devices else None,
            devices=[str(device) for device in devices],
            device_count=len(devices),
            local_device_count=int(jax.local_device_count()),
            process={"index": int(jax.process_index()), "count": int(jax.process_count())},
            simulated=kind == "CPU" and len(devices) > 1,
        )
    except Exception as error:  # noqa: BLE001 - describing must never stop the user's training
        runtime.update(kind="unknown", problem=f"{type(error).__name__}: {error}")
    try:
        runtime.update(_distribution_keys(distribution))
    except Exception as error:  # noqa: BLE001 - as above
        runtime.update(strategy=type(distribution).__name__, num_replicas=1)
        runtime.setdefault("problem", f"{type(error).__name__}: {error}")
    return runtime


def _distribution_keys(distribution: Any) -> dict[str, Any]:
    if distribution is None:
        return {"strategy": "none", "num_replicas": 1}
    if is_jax_mesh(distribution):
        axes = _axes(distribution.axis_names, distribution.devices.shape)
        batch_axis = next((name for name in BATCH_AXIS_NAMES if name in axes), next(iter(axes), ""))
        return {"strategy": "Mesh", "num_replicas": axes.get(batch_axis, 1), "mesh": {"axes": axes}}
    mesh = distribution.device_mesh
    axes = _axes(mesh.axis_names, mesh.shape)
    batch_axis = str(getattr(distribution, "batch_dim_name", None) or next(iter(axes), ""))
    return {
        "strategy": type(distribution).__name__,
        "num_replicas": axes.get(batch_axis, 1),
        "mesh": {"axes": axes},
    }


def _axes(names: Any, shape: Any) -> dict[str, int]:
    sizes = shape.values() if isinstance(shape, Mapping) else shape
    return {str(name): int(size) for name, size in zip(names, sizes, strict=True)}
