"""Finds the accelerator, builds the strategy, describes the devices.

Detection order (design.md), each step's reason recorded for the Devices screen:

1. ``--tpu NAME|grpc://host:port|local``: TPUClusterResolver, connect,
   initialize, TPUStrategy. A failure is an error, never a silent fallback.
2. Automatic: COLAB_TPU_ADDR or TPU_NAME set, or TPU VM device files present.
3. GPUs visible: MirroredStrategy.
4. CPU: split into ``cpu_devices`` logical devices (default 8, like a v2-8 or
   v3-8 board) mirrored by a MirroredStrategy, labelled as simulated replicas.

Logical devices can be configured once per process, so the runtime is made
once and cached; tests share one 8-device configuration.
"""

from __future__ import annotations

import glob
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping

# TensorFlow reads this when it is first imported; tpudash imports TF only
# through this module (or after it), so the C++ INFO chatter stays off.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

TPU_DEVICE_GLOBS = ("/dev/accel[0-9]*", "/dev/vfio/[0-9]*")
DEFAULT_TPU_TIMEOUT_SECONDS = 60.0


class RuntimeSetupError(RuntimeError):
    """The requested accelerator could not be set up; the message says why."""


@dataclass
class LogicalDeviceInfo:
    """One logical device as the strategy sees it."""

    index: int
    name: str
    device_type: str
    job: str | None = None
    replica: int | None = None
    task: int | None = None
    memory: dict | None = None


@dataclass
class RuntimeDescription:
    """Everything the Devices screen and ``tpudash devices`` show."""

    kind: str
    strategy: str
    num_replicas: int
    devices: list[LogicalDeviceInfo]
    simulated: bool = False
    topology: dict | None = None
    tpu_address: str | None = None
    tf_version: str = ""
    keras_version: str = ""
    host: str = field(default_factory=socket.gethostname)
    init_seconds: float = 0.0
    reasons: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Runtime:
    """The live session: the strategy and the logical devices it spans."""

    strategy: Any
    description: RuntimeDescription
    logical_devices: list = field(default_factory=list)
    resolver: Any = None

    @property
    def device_names(self) -> list[str]:
        return [device.name for device in self.description.devices]

    @property
    def num_replicas(self) -> int:
        return self.description.num_replicas

    @property
    def kind(self) -> str:
        return self.description.kind

    def summary(self) -> dict:
        """The compact description stored with every run."""
        description = self.description
        return {
            "kind": description.kind,
            "strategy": description.strategy,
            "num_replicas": description.num_replicas,
            "simulated": description.simulated,
            "devices": self.device_names,
            "tf_version": description.tf_version,
            "keras_version": description.keras_version,
            "host": description.host,
        }


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


def tpu_request(tpu_flag: str | None, environ: Mapping[str, str], device_files: list[str]) -> tuple[str | None, bool, str]:
    """Which TPU to try: (resolver argument, explicit?, reason text).

    Returns (None, False, reason) when there is no sign of a TPU. The resolver
    argument '' means "TPUClusterResolver()" (it reads TPU_NAME itself).
    """
    if tpu_flag:
        return tpu_flag, True, f"--tpu {tpu_flag} given"
    if environ.get("COLAB_TPU_ADDR"):
        return "grpc://" + environ["COLAB_TPU_ADDR"], False, f"COLAB_TPU_ADDR={environ['COLAB_TPU_ADDR']}"
    if environ.get("TPU_NAME"):
        return "", False, f"TPU_NAME={environ['TPU_NAME']}"
    if device_files:
        return "local", False, f"TPU VM device files present ({', '.join(device_files[:2])})"
    return None, False, "no --tpu flag, no COLAB_TPU_ADDR or TPU_NAME, no TPU device files (/dev/accel*, /dev/vfio)"


def _call_with_timeout(function: Callable[[], Any], seconds: float, what: str) -> Any:
    """Run a possibly hanging TF call (connect to an unreachable gRPC address)."""
    box: dict[str, Any] = {}

    def target():
        try:
            box["value"] = function()
        except BaseException as error:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = error

    thread = threading.Thread(target=target, name=f"tpudash-{what}", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise RuntimeSetupError(f"{what} did not answer within {seconds:g} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _connect_tpu(tf: Any, tpu_argument: str, timeout: float) -> tuple[Any, Any, Any]:
    """Resolver → connect → initialize → TPUStrategy, each failure explained."""
    try:
        if tpu_argument == "":
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
        else:
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu_argument)
    except Exception as error:  # noqa: BLE001 - any resolver failure is reported as such
        raise RuntimeSetupError(f"TPUClusterResolver(tpu={tpu_argument!r}) failed: {type(error).__name__}: {error}") from error

    def connect_and_initialize():
        if tpu_argument != "local":
            tf.config.experimental_connect_to_cluster(resolver)
        return tf.tpu.experimental.initialize_tpu_system(resolver)

    try:
        topology = _call_with_timeout(connect_and_initialize, timeout, f"connecting to TPU {tpu_argument or 'from TPU_NAME'}")
    except RuntimeSetupError:
        raise
    except Exception as error:  # noqa: BLE001
        message = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise RuntimeSetupError(f"initializing TPU {tpu_argument!r} failed: {type(error).__name__}: {message}") from error
    if not tf.config.list_logical_devices("TPU"):
        raise RuntimeSetupError(f"TPU {tpu_argument!r} initialized but shows no TPU devices")
    strategy = tf.distribute.TPUStrategy(resolver)
    return resolver, topology, strategy


def _topology_dict(topology: Any) -> dict | None:
    if topology is None:
        return None
    try:
        return {
            "mesh_shape": [int(size) for size in topology.mesh_shape],
            "num_tasks": int(topology.num_tasks),
            "num_tpus_per_task": int(topology.num_tpus_per_task),
        }
    except Exception:  # noqa: BLE001 - topology is informative only
        return None


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
                f"logical devices were already configured in this process ({existing} CPU devices); "
                f"--cpu-devices {count} applies from the next start"
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
    device_files: list[str] | None = None,
    tpu_timeout: float = DEFAULT_TPU_TIMEOUT_SECONDS,
    tf: Any = None,
) -> Runtime:
    """Run the detection order and return the runtime; RuntimeSetupError on an explicit failure."""
    started = time.perf_counter()
    environ = os.environ if environ is None else environ
    if device_files is None:
        device_files = sorted(path for pattern in TPU_DEVICE_GLOBS for path in glob.glob(pattern))
    if tf is None:
        import tensorflow as tf  # noqa: PLW0621 - the real module unless a test passes a fake
    reasons: dict[str, str] = {}
    tpu_argument, explicit, why = tpu_request(tpu, environ, device_files)

    if tpu_argument is not None:
        try:
            resolver, topology, strategy = _connect_tpu(tf, tpu_argument, tpu_timeout)
        except RuntimeSetupError as error:
            if explicit:
                raise
            reasons["TPU"] = f"{why}, but {error}"
        else:
            logical = tf.config.list_logical_devices("TPU")
            return _runtime(tf, "TPU", strategy, logical, started, reasons, topology=_topology_dict(topology),
                            tpu_address=resolver.master() or tpu_argument, resolver=resolver,
                            notes=[f"TPU found: {why}"])
    else:
        reasons["TPU"] = why

    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        strategy = tf.distribute.MirroredStrategy()
        logical = tf.config.list_logical_devices("GPU")
        return _runtime(tf, "GPU", strategy, logical, started, reasons)
    reasons["GPU"] = "TensorFlow sees no GPU (tf.config.list_physical_devices('GPU') is empty)"

    notes = _split_cpu(tf, cpu_devices)
    logical = tf.config.list_logical_devices("CPU")
    strategy = tf.distribute.MirroredStrategy(devices=[device.name for device in logical])
    notes.append(f"no accelerator: the CPU is split into {len(logical)} logical devices that stand in for TPU cores")
    return _runtime(tf, "CPU", strategy, logical, started, reasons, simulated=True, notes=notes)


def _runtime(tf, kind, strategy, logical, started, reasons, topology=None, tpu_address=None,
             resolver=None, simulated=False, notes=None) -> Runtime:
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
    )
    return Runtime(strategy=strategy, description=description, logical_devices=sorted(logical, key=lambda d: parse_device_name(d.name).get("index") or 0), resolver=resolver)


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


def current_runtime() -> Runtime | None:
    """The runtime if it has been detected, else None (never triggers detection)."""
    return _current
