"""Finds the accelerator, builds the strategy, describes the devices.

Detection order (design.md), each step's reason recorded for the Devices screen:

0. Before TensorFlow is imported, ``tpudash.accel.hostcheck`` scans the chips, the
   installed builds and the TPU's holder; what it finds can rule the TPU out
   (or refuse to import a TensorFlow that would abort).
1. ``--tpu NAME|grpc://host:port|local``: TPUClusterResolver, connect,
   initialize, TPUStrategy. A failure is an error, never a silent fallback.
   ``--tpu none`` leaves the TPU alone.
2. Automatic: COLAB_TPU_ADDR or TPU_NAME set, or TPU chips on the PCI bus. A
   failure falls back to the CPU default with the reason. With local chips
   the TPU is first tried in a child process (``tpudash.accel.tpuprobe``); a
   failure after TensorFlow started in this process (``TpuFallback``) needs
   a fresh process, as this one can no longer split its CPU.
2b. ``TF_CONFIG`` describes a cluster of more than one task (``tpudash run
   --worker-index I --cluster …`` sets it, or the user exports it):
   MultiWorkerMirroredStrategy over the local GPUs or the CPU's device 0,
   with the lost-peer timeouts of ``tpudash.accel.multiworker``. A malformed
   TF_CONFIG is an error naming the field.
3. GPUs visible: MirroredStrategy.
4. CPU: split into ``cpu_devices`` logical devices (default 8, like a v2-8 or
   v3-8 board) mirrored by a MirroredStrategy, labelled as simulated replicas.

When no local chip is to be used, libtpu is kept from loading at all. Every
TensorFlow start-up step is bounded (the TPU timeout; at least 60 s for the
import itself). Logical devices can be
configured once per process, so the runtime is made once and cached; tests
share one 8-device configuration.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
import time
from collections.abc import Mapping, MutableMapping
from typing import Any

from tpudash.accel import hostcheck, multiworker
from tpudash.accel.description import LogicalDeviceInfo, Runtime, RuntimeDescription
from tpudash.accel.hostcheck import Chips, HostCheck
from tpudash.accel.startup import (
    RuntimeSetupError,
    StartupTimeout,
    TensorFlowMissing,
    TpuFallback,
    call_with_timeout,
    connect_tpu,
)

# TensorFlow reads this when it is first imported; tpudash imports TF only
# through this module (or after it), so the C++ INFO chatter stays off.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

DEFAULT_TPU_TIMEOUT_SECONDS = 60.0
# A cold import of TensorFlow takes 3-30 s on a loaded machine; only libtpu's
# start-up hangs for minutes. The TPU timeout can raise this floor, not lower it.
TENSORFLOW_IMPORT_FLOOR_SECONDS = 60.0
NO_TPU = "none"
# Set for a process that starts again on the CPU default after an automatic
# TPU attempt failed: the reason the first process found, for the Devices screen.
FALLBACK_REASON_VARIABLE = "TPUDASH_TPU_FALLBACK_REASON"


def parse_device_name(name: str) -> dict:
    """``/job:worker/replica:0/task:0/device:TPU:3`` → job, replica, task, index."""
    parts: dict[str, Any] = {}
    for segment in name.strip("/").split("/"):
        key, _, value = segment.partition(":")
        if key == "job":
            parts["job"] = value
        elif key in ("replica", "task"):
            parts[key] = int(value) if value.isdigit() else None
        elif key == "device":
            device_type, _, index = value.rpartition(":")
            parts["device_type"] = device_type
            parts["index"] = int(index) if index.isdigit() else None
    return parts


def tpu_request(tpu_flag: str | None, environ: Mapping[str, str], chips: Chips) -> tuple[str | None, bool, str]:
    """Which TPU to try: (resolver argument, explicit?, reason text).

    Returns (None, explicit, reason) when no TPU is to be tried: no sign of
    one, ``--tpu none``, or ``local`` on a host whose chip scan finds no chip
    (libtpu would spend minutes asking a cloud metadata server for nothing).
    The resolver argument '' means "TPUClusterResolver()" (it reads TPU_NAME).
    """
    if tpu_flag and tpu_flag.lower() == NO_TPU:
        return None, True, environ.get(FALLBACK_REASON_VARIABLE) or "--tpu none given: the TPU is left alone"
    no_local_chip = not chips.count and chips.scan_error is None
    if tpu_flag:
        if tpu_flag == "local" and no_local_chip:
            return (
                None,
                True,
                f"--tpu local given, but the chip scan finds no TPU chip on this host ({chips.describe()})",
            )
        return tpu_flag, True, f"--tpu {tpu_flag} given"
    if environ.get("COLAB_TPU_ADDR"):
        return "grpc://" + environ["COLAB_TPU_ADDR"], False, f"COLAB_TPU_ADDR={environ['COLAB_TPU_ADDR']}"
    if environ.get("TPU_NAME"):
        if environ["TPU_NAME"] == "local" and no_local_chip:
            return None, False, "TPU_NAME=local, but the chip scan finds no TPU chip on this host"
        return "", False, f"TPU_NAME={environ['TPU_NAME']}"
    if chips.count:
        return "local", False, f"the chip scan finds {chips.describe()}"
    why_not = chips.scan_error or "no TPU chip on the PCI bus"
    return None, False, f"no --tpu flag, no COLAB_TPU_ADDR or TPU_NAME, and {why_not}"


def keep_libtpu_unloaded(environ: MutableMapping[str, str]) -> None:
    """Stop the TPU build of TensorFlow from loading libtpu in this process.

    libtpu would take the host's one TPU lock (from a notebook that holds it),
    abort the process when it does not match tensorflow-tpu, or, off Google
    Cloud, ask the metadata server 30 times per variable. A value the user set
    is kept.
    """
    environ.setdefault("TPU_LOAD_LIBRARY", "0")
    environ.setdefault("TPU_SKIP_MDS_QUERY", "1")


def import_tensorflow(timeout: float) -> Any:
    """``import tensorflow``, bounded: libtpu's start-up can block for minutes."""
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    try:
        return call_with_timeout(lambda: importlib.import_module("tensorflow"), timeout, "importing TensorFlow")
    except RuntimeSetupError:
        raise
    except Exception as error:  # noqa: BLE001 - a broken install is reported, not raised raw
        raise RuntimeSetupError(f"importing TensorFlow failed: {type(error).__name__}: {error}") from error


def _memory(tf: Any, name: str) -> dict | None:
    try:
        info = tf.config.experimental.get_memory_info(name)
    except Exception:  # noqa: BLE001 - CPUs do not answer; that is expected
        return None
    return {key: int(value) for key, value in info.items()}


def _split_cpu(tf: Any, count: int) -> list[str]:
    """Configure ``count`` logical CPUs; notes if TF was already initialized."""
    notes = []
    cpus = tf.config.list_physical_devices("CPU")
    try:
        tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()] * count)
    except RuntimeError:
        existing = len(tf.config.list_logical_devices("CPU"))
        if existing != count:
            notes.append(
                f"TensorFlow's runtime had already started in this process, so the CPU could not be split: "
                f"{existing} logical CPU device(s), not {count}; a new tpudash process gets {count}"
            )
    return notes


def _versions(tf: Any) -> tuple[str, str]:
    try:
        import keras

        keras_version = keras.__version__
    except Exception:  # noqa: BLE001
        keras_version = "unknown"
    return tf.__version__, keras_version


def detect(
    tpu: str | None = None,
    cpu_devices: int = 8,
    environ: Mapping[str, str] | None = None,
    host: HostCheck | None = None,
    tpu_timeout: float = DEFAULT_TPU_TIMEOUT_SECONDS,
    tf: Any = None,
) -> Runtime:
    """Run the detection order and return the runtime.

    Raises RuntimeSetupError when an explicit TPU fails or TensorFlow cannot
    start, TensorFlowMissing without TensorFlow, and TpuFallback when an
    automatic TPU attempt failed and the CPU default needs a fresh process.
    ``host`` and ``tf`` replace the host scan and the tensorflow module in tests.
    """
    started = time.perf_counter()
    environ = os.environ if environ is None else environ
    host = hostcheck.inspect() if host is None else host
    reasons: dict[str, str] = {}
    tpu_argument, explicit, why = tpu_request(tpu, environ, host.chips)
    if tpu_argument is not None and host.blocking(tpu=True):
        blocker = host.blocking(tpu=True)[0].message
        if explicit:
            raise RuntimeSetupError(f"{why}, but {blocker}; --tpu none runs jobs on the CPU default")
        reasons["TPU"] = f"{why}, but {blocker}"
        tpu_argument = None
    elif tpu_argument is None:
        if explicit and (tpu or "").lower() != NO_TPU:
            raise RuntimeSetupError(f"{why}; --tpu none runs jobs on the CPU default")
        reasons["TPU"] = why
    cluster = None
    if tpu_argument is None:
        # A TPU pod runs one client (TPUStrategy drives every host): TF_CONFIG matters only off a TPU.
        try:
            cluster = multiworker.cluster_from_tf_config(environ)
        except ValueError as error:
            raise RuntimeSetupError(str(error)) from None

    if tf is None:
        if not host.tensorflow_found:
            raise TensorFlowMissing(host.blocking(tensorflow=True)[0].message)
        fatal = host.blocking(tensorflow=True)
        if fatal:
            raise RuntimeSetupError(fatal[0].message)
        if tpu_argument is not None and host.chips.count and "tensorflow" not in sys.modules:
            # libtpu loads with TensorFlow here and can hang the import with
            # the GIL held: try it in a child first (tpudash.accel.tpuprobe).
            from tpudash.accel.tpuprobe import probe_tpu

            probe = probe_tpu(tpu_argument, tpu_timeout)
            if not probe.ok:
                if explicit:
                    raise RuntimeSetupError(f"{why}, but {probe.error}; --tpu none runs jobs on the CPU default")
                reasons["TPU"] = f"{why}, but {probe.error}"
                tpu_argument = None
        if tpu_argument is None or not host.chips.count:
            keep_libtpu_unloaded(os.environ)
        try:
            tf = import_tensorflow(max(tpu_timeout, TENSORFLOW_IMPORT_FLOOR_SECONDS))
        except StartupTimeout as error:
            if tpu_argument is None or explicit:
                raise
            raise TpuFallback(f"{why}, but {error}") from error

    if tpu_argument is not None:
        try:
            resolver, topology, strategy = connect_tpu(tf, tpu_argument, tpu_timeout)
        except RuntimeSetupError as error:
            if explicit:
                raise
            raise TpuFallback(f"{why}, but {error}") from error
        logical = tf.config.list_logical_devices("TPU")
        return _runtime(
            tf,
            "TPU",
            strategy,
            logical,
            started,
            reasons,
            topology=multiworker.pod_topology(resolver, topology),
            tpu_address=resolver.master() or tpu_argument,
            resolver=resolver,
            notes=[f"TPU found: {why}"],
            host=host,
        )

    gpus = tf.config.list_physical_devices("GPU")
    if cluster is not None:
        return _multi_worker_runtime(tf, cluster, bool(gpus), started, reasons, host)
    if gpus:
        strategy = tf.distribute.MirroredStrategy()
        logical = tf.config.list_logical_devices("GPU")
        return _runtime(tf, "GPU", strategy, logical, started, reasons, host=host)
    reasons["GPU"] = "TensorFlow sees no GPU (tf.config.list_physical_devices('GPU') is empty)"

    notes = _split_cpu(tf, cpu_devices)
    logical = tf.config.list_logical_devices("CPU")
    strategy = tf.distribute.MirroredStrategy(devices=[device.name for device in logical])
    notes.append(f"no accelerator: the CPU is split into {len(logical)} logical devices that stand in for TPU cores")
    return _runtime(tf, "CPU", strategy, logical, started, reasons, simulated=True, notes=notes, host=host)


def _multi_worker_runtime(
    tf: Any, cluster: multiworker.ClusterTask, gpus: bool, started: float, reasons: dict, host: HostCheck
) -> Runtime:
    """MultiWorkerMirroredStrategy over TF_CONFIG's cluster; waits (bounded) for every worker to join."""
    heartbeat = multiworker.HEARTBEAT_TIMEOUT_SECONDS
    collective = multiworker.COLLECTIVE_TIMEOUT_SECONDS
    try:
        strategy = multiworker.make_strategy(tf, cluster, heartbeat_timeout=heartbeat, collective_timeout=collective)
    except Exception as error:  # noqa: BLE001 - TensorFlow's errors vary; the message says what failed
        raise RuntimeSetupError(
            f"joining the cluster as worker {cluster.worker} of {cluster.workers} ({cluster.address}) failed: "
            f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
        ) from error
    kind = "GPU" if gpus else "CPU"
    logical = [
        device
        for device in tf.config.list_logical_devices(kind)
        if parse_device_name(device.name).get("task") in (None, cluster.task_index)
    ]
    if kind == "CPU":
        # One replica per worker on CPU: the strategy's only local device.
        local = set(getattr(strategy.extended, "worker_devices", ()) or ())
        logical = [device for device in logical if device.name in local] or logical[:1]
        reasons["GPU"] = "TensorFlow sees no GPU (tf.config.list_physical_devices('GPU') is empty)"
    notes = [
        f"TF_CONFIG: worker {cluster.worker} of {cluster.workers} ({cluster.task_type} {cluster.task_index}); "
        f"MultiWorkerMirroredStrategy over {', '.join(cluster.addresses)}",
    ]
    if kind == "CPU":
        notes.append(
            "MultiWorkerMirroredStrategy uses one CPU device per worker: the CPU is not split into logical devices, "
            f"so the cluster has {strategy.num_replicas_in_sync} replicas, one per worker"
        )
    runtime = _runtime(tf, kind, strategy, logical, started, reasons, notes=notes, host=host)
    # TensorFlow's class is CollectiveAllReduceStrategy, exported as MultiWorkerMirroredStrategy: the name users know.
    runtime.description.strategy = "MultiWorkerMirroredStrategy"
    runtime.description.cluster = multiworker.cluster_description(cluster, heartbeat, collective)
    return runtime


def _runtime(
    tf,
    kind,
    strategy,
    logical,
    started,
    reasons,
    topology=None,
    tpu_address=None,
    resolver=None,
    simulated=False,
    notes=None,
    host: HostCheck | None = None,
) -> Runtime:
    devices = []
    for position, device in enumerate(logical):
        parts = parse_device_name(device.name)
        devices.append(
            LogicalDeviceInfo(
                index=parts.get("index", position) if parts.get("index") is not None else position,
                name=device.name,
                device_type=device.device_type,
                job=parts.get("job"),
                replica=parts.get("replica"),
                task=parts.get("task"),
                memory=_memory(tf, device.name),
            )
        )
    devices.sort(key=lambda item: item.index)
    tf_version, keras_version = _versions(tf)
    description = RuntimeDescription(
        kind=kind,
        strategy=type(strategy).__name__,
        num_replicas=int(strategy.num_replicas_in_sync),
        devices=devices,
        simulated=simulated,
        topology=topology,
        tpu_address=tpu_address,
        tf_version=tf_version,
        keras_version=keras_version,
        init_seconds=round(time.perf_counter() - started, 3),
        reasons=reasons,
        notes=list(notes or []),
        host_check=host.to_dict() if host is not None else None,
    )
    return Runtime(
        strategy=strategy,
        description=description,
        logical_devices=sorted(logical, key=lambda d: parse_device_name(d.name).get("index") or 0),
        resolver=resolver,
    )


_lock = threading.Lock()
_current: Runtime | None = None


def get_runtime(settings: Any, reinitialize: bool = False) -> Runtime:
    """The process's runtime, detected on first use from ``settings``."""
    global _current
    with _lock:
        if _current is None or reinitialize:
            _current = detect(
                tpu=getattr(settings, "tpu", None),
                cpu_devices=getattr(settings, "cpu_devices", 8),
                tpu_timeout=getattr(settings, "tpu_timeout", DEFAULT_TPU_TIMEOUT_SECONDS),
            )
        return _current
