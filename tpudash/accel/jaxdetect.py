"""The JAX engine's runtime: every device ``jax.devices()`` lists, as one batch mesh, described as the Devices screen shows it.

The engine runs its jobs on JAX where the session has JAX and no TensorFlow
(Colab's TPU runtime), or when asked (``--framework jax``). Jobs get a
``Runtime`` whose ``strategy`` is a ``jax.sharding.Mesh`` with one axis,
``batch``, over every device, and whose description has one row per device
(index, id, platform, ``device_kind``, process index, coords and memory where
the backend has them).

On the CPU default the CPU is split into ``cpu_devices`` devices before JAX
starts its backend (XLA reads the flag once), so every job runs on a laptop
as it does on a TPU board's cores. Only the engine and headless ``tpudash
run`` call ``detect_jax`` (through ``detect_jax_runtime``, which first scans
the host as the TensorFlow path does and decides whether JAX may take the
TPU): importing JAX takes the TPU.
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Mapping, MutableMapping
from typing import Any

from tpudash.accel import hostcheck
from tpudash.accel.description import LogicalDeviceInfo, Runtime, RuntimeDescription
from tpudash.accel.startup import RuntimeSetupError

BATCH_AXIS = "batch"
"""The mesh's one axis: a job's batch (or its per-replica inputs) is split over it."""

_DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


def cpu_split_environment(environ: Mapping[str, str], devices: int) -> dict[str, str]:
    """``environ`` with XLA's CPU split into ``devices`` and its thread pool sized for collectives.

    ``NPROC``: XLA's CPU client runs every device's program on one pool of
    ``max(NPROC or the cores, devices)`` threads. With 8 devices on 2 cores
    that is 8 threads: 7 devices' programs block in an all-reduce while the
    8th's matmul waits for a thread, and XLA aborts the process after 40 s
    ("Expected 8 threads to join the rendezvous"). Twice the devices leaves
    threads for the matmuls. A value the user set is kept.
    """
    environment = dict(environ)
    xla_flags = environment.get("XLA_FLAGS", "")
    if _DEVICE_COUNT_FLAG not in xla_flags:
        environment["XLA_FLAGS"] = f"{xla_flags} {_DEVICE_COUNT_FLAG}={devices}".strip()
    environment.setdefault("NPROC", str(2 * devices))
    return environment


def prepare_jax_environment(environ: MutableMapping[str, str], cpu_devices: int, use_tpu: bool) -> None:
    """Set what JAX and Keras read once: the CPU split, Keras on JAX, and the CPU only when the TPU is left alone."""
    environ.update(cpu_split_environment(environ, cpu_devices))
    environ["KERAS_BACKEND"] = "jax"  # the JAX engine's training is Keras 3 on JAX, whatever the shell said
    if not use_tpu:
        environ["JAX_PLATFORMS"] = "cpu"


class JaxMissing(RuntimeSetupError):
    """The framework is JAX (``--framework jax``) and JAX is not installed; the message ends with the install line."""


def tpu_for_jax(
    tpu_flag: str | None, host: hostcheck.HostCheck, environ: Mapping[str, str]
) -> tuple[bool, dict[str, str]]:
    """Whether JAX may take this host's TPU, and why not (the Devices screen's "why not TPU").

    JAX drives only this host's chips: ``--tpu none`` leaves them alone, as
    does another process that holds them (libtpu admits one per host; an
    explicit ``--tpu local`` then fails, as it does on TensorFlow). A TPU
    named by address is TensorFlow's (``TPUClusterResolver``), an error here.
    """
    from tpudash.accel.runtime import FALLBACK_REASON_VARIABLE, NO_TPU

    flag = (tpu_flag or "").strip()
    if flag.lower() == NO_TPU:
        return False, {"TPU": environ.get(FALLBACK_REASON_VARIABLE) or "--tpu none given: the TPU is left alone"}
    if flag and flag != "local":
        raise RuntimeSetupError(
            f"--tpu {flag}: JAX drives this host's own chips only (--tpu local, or none); a TPU by name or "
            "address needs the TensorFlow engine (--framework tensorflow)"
        )
    if host.holders and host.chips.count:
        # Not the host check's diagnosis: without TensorFlow it stops at "TensorFlow is not installed".
        held = f"the TPU is held by {host.holders[0].describe()}; libtpu admits one process per host"
        if flag:
            raise RuntimeSetupError(f"--tpu local given, but {held}; --tpu none runs jobs on the CPU default")
        return False, {"TPU": f"{held}, so jobs run on the CPU default"}
    if not host.chips.count:
        why = host.chips.scan_error or "no TPU chip on the PCI bus"
        return False, {"TPU": f"the chip scan finds none ({why})"}
    return True, {}


def detect_jax_runtime(settings: Any, host: hostcheck.HostCheck | None = None) -> Runtime:
    """The JAX engine's runtime for ``settings``: the host scanned, the TPU taken or left alone, every device a row.

    Raises ``JaxMissing`` without JAX and ``RuntimeSetupError`` for a TPU it
    cannot use as asked. On the CPU (no chip, ``--tpu none``, the chips held
    elsewhere) JAX starts on the CPU alone, split into ``cpu_devices``.
    """
    host = hostcheck.inspect() if host is None else host
    kind = "tpu" if host.chips.count else "cpu"
    if importlib.util.find_spec("jax") is None:
        raise JaxMissing(f"JAX is not installed; jobs on JAX need it: {hostcheck.jax_install_line(kind)}")
    use_tpu, reasons = tpu_for_jax(getattr(settings, "tpu", None), host, os.environ)
    # No chip to take: JAX is kept on the CPU (it would look for a TPU's libtpu, a GPU's CUDA, and warn of each).
    runtime = detect_jax(
        int(getattr(settings, "cpu_devices", 8)), use_tpu=use_tpu and bool(host.chips.count), reasons=reasons
    )
    description = runtime.description
    if use_tpu and description.kind != "TPU":
        description.reasons["TPU"] = (
            f"the chip scan finds {host.chips.describe()}, but JAX started on {description.kind}"
        )
    if description.kind == "CPU":
        description.reasons.setdefault("GPU", "JAX lists no GPU (jax.devices() has CPU devices only)")
    description.host_check = host.to_dict()
    return runtime


def detect_jax(cpu_devices: int = 8, use_tpu: bool = True, reasons: Mapping[str, str] | None = None) -> Runtime:
    """Import JAX (after ``prepare_jax_environment``) and describe its devices as one batch mesh.

    ``use_tpu`` False keeps JAX on the CPU (``--tpu none``, or the chips held
    by another process). Raises what JAX raises when it cannot start.
    """
    started = time.perf_counter()
    prepare_jax_environment(os.environ, cpu_devices, use_tpu)
    import jax
    import numpy as np

    devices = list(jax.devices())
    mesh = jax.sharding.Mesh(np.array(devices), (BATCH_AXIS,))
    platform = devices[0].platform if devices else "cpu"
    kind = platform.upper()
    notes = []
    if kind == "CPU" and len(devices) > 1:
        notes.append(f"XLA split the CPU into {len(devices)} devices ({_DEVICE_COUNT_FLAG}={len(devices)})")
    description = RuntimeDescription(
        kind=kind,
        strategy="Mesh",
        num_replicas=len(devices),
        devices=[device_info(position, device) for position, device in enumerate(devices)],
        simulated=kind == "CPU" and len(devices) > 1,
        keras_version=_keras_version(),
        init_seconds=round(time.perf_counter() - started, 3),
        reasons=dict(reasons or {}),
        notes=notes,
        framework="jax",
        jax_version=str(getattr(jax, "__version__", "")),
    )
    return Runtime(strategy=mesh, description=description, logical_devices=devices)


def device_info(position: int, device: Any) -> LogicalDeviceInfo:
    """One ``jax.devices()`` entry as a row of the Devices screen."""
    platform = str(device.platform)
    coords = getattr(device, "coords", None)
    return LogicalDeviceInfo(
        index=position,
        name=f"{platform.upper()}:{device.id}",
        device_type=platform.upper(),
        platform=platform,
        device_kind=str(getattr(device, "device_kind", "") or "") or None,
        process_index=int(getattr(device, "process_index", 0)),
        coords=[int(value) for value in coords] if coords is not None else None,
        memory=device_memory(device),
    )


def device_memory(device: Any) -> dict | None:
    """``memory_stats()`` as the TensorFlow path reports memory (``current``, ``peak``, and ``limit``); None without."""
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 - the CPU backend has none, some raise instead of returning None
        return None
    if not stats:
        return None
    memory = {
        "current": stats.get("bytes_in_use"),
        "peak": stats.get("peak_bytes_in_use"),
        "limit": stats.get("bytes_limit"),
    }
    return {key: int(value) for key, value in memory.items() if value is not None} or None


def _keras_version() -> str:
    try:
        import keras
    except ImportError:
        return ""
    return str(getattr(keras, "__version__", ""))
