"""The runtime as the dashboard and the runs see it: what was detected, and a ``Runtime`` that carries it.

``tpudash.accel.runtime`` detects the runtime in the process that owns
TensorFlow (the engine, headless ``tpudash run``) and fills these in; the
engine sends the description to the dashboard as JSON, and the dashboard
rebuilds it here (``Runtime.from_description``) without TensorFlow.
"""

from __future__ import annotations

import socket
from dataclasses import asdict, dataclass, field, fields
from typing import Any


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
    platform: str | None = None
    """JAX's ``device.platform`` (``cpu``, ``tpu``); None for a TensorFlow device (its ``device_type`` says)."""
    device_kind: str | None = None
    """JAX's ``device.device_kind`` (``TPU v5 lite``, ``cpu``); None under TensorFlow."""
    process_index: int | None = None
    """JAX's ``device.process_index``: the host that drives the device; None under TensorFlow."""
    coords: list[int] | None = None
    """A TPU core's place in the slice (JAX's ``device.coords``); None where the backend has none."""


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
    host_check: dict | None = None
    """What the host scan found before TensorFlow was imported (chips, builds, diagnoses)."""
    cluster: dict | None = None
    """This worker's place in a TF_CONFIG cluster (``tpudash.accel.multiworker.cluster_description``); None alone."""
    framework: str = "tensorflow"
    """What runs the jobs: ``tensorflow`` (a ``tf.distribute`` strategy) or ``jax`` (a ``jax.sharding.Mesh``)."""
    jax_version: str = ""

    def strategy_text(self) -> str:
        """The strategy as a user reads it: ``MultiWorkerMirroredStrategy, worker 1 of 2`` in a cluster."""
        cluster = self.cluster
        if not cluster:
            return self.strategy
        role = " (chief)" if cluster.get("worker") == 0 else ""
        return f"{self.strategy}, worker {cluster.get('worker')} of {cluster.get('workers')}{role}"

    def framework_text(self) -> str:
        """The header's words for what runs the jobs: ``JAX 0.10.2 · 8 CPU devices``, ``JAX 0.10.2 · 4 TPU v5 lite
        chips``; ``TensorFlow 2.21.0`` under TensorFlow."""
        if self.framework != "jax":
            return f"TensorFlow {self.tf_version}"
        return f"JAX {self.jax_version} · {self.devices_text()}"

    def devices_text(self) -> str:
        """``8 CPU devices``, ``4 TPU v5 lite chips``, ``8 TPU v3 cores``: JAX's devices by kind, as one device is."""
        counts: dict[str, int] = {}
        for device in self.devices:
            kind = device.device_kind if device.platform == "tpu" and device.device_kind else device.device_type
            counts[kind] = counts.get(kind, 0) + 1
        return (
            " + ".join(f"{count} {kind} {_device_word(kind, count)}" for kind, count in counts.items()) or "no devices"
        )

    def cluster_text(self) -> str | None:
        """The cluster's addresses (this worker's marked) and how soon a lost peer fails the run; None alone."""
        cluster = self.cluster
        if not cluster:
            return None
        mine = cluster.get("worker")
        addresses = ", ".join(
            f"{address} (this worker)" if position == mine else address
            for position, address in enumerate(cluster.get("addresses") or [])
        )
        return (
            f"{addresses}; one replica per worker on CPU (CPU:0, not split); a lost worker fails the run "
            f"within {cluster.get('lost_worker_deadline_seconds', 0):g} s (heartbeat timeout "
            f"{cluster.get('heartbeat_timeout_seconds', 0):g} s)"
        )

    def topology_text(self) -> str | None:
        """The TPU topology: ``4 hosts × 4 chips (16 chips, 1 core each), mesh [2, 2, 4, 1]``; None off a TPU."""
        topology = self.topology
        if not topology:
            return None
        if topology.get("hosts") and topology.get("chips_per_host"):
            hosts, chips = topology["hosts"], topology["chips_per_host"]
            cores = topology.get("cores_per_chip") or 1
            return (
                f"{hosts} host{'s' if hosts != 1 else ''} × {chips} chip{'s' if chips != 1 else ''} "
                f"({hosts * chips} chips, {cores} core{'s' if cores != 1 else ''} each), "
                f"mesh {topology.get('mesh_shape')}"
            )
        return (
            f"mesh {topology.get('mesh_shape')}, {topology.get('num_tasks')} task(s), "
            f"{topology.get('num_tpus_per_task')} cores per task"
        )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> RuntimeDescription:
        """The inverse of ``to_dict`` (the engine sends its description to the dashboard as JSON)."""
        known = {item.name for item in fields(cls)}
        values = {name: value for name, value in data.items() if name in known}
        device_fields = {item.name for item in fields(LogicalDeviceInfo)}
        values["devices"] = [
            LogicalDeviceInfo(**{name: value for name, value in device.items() if name in device_fields})
            for device in data.get("devices", [])
        ]
        return cls(**values)


def _device_word(kind: str, count: int) -> str:
    """What one JAX device of ``kind`` is: a TPU v2 or v3 device is one core of a chip, later ones a chip each."""
    if kind.startswith("TPU"):
        word = "core" if kind in ("TPU v2", "TPU v3") else "chip"
    else:
        word = "device"
    return word if count == 1 else word + "s"


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

    @property
    def framework(self) -> str:
        """``tensorflow`` or ``jax``: which of a job's runners runs on this runtime (``JobSpec.runner_for``)."""
        return self.description.framework

    @classmethod
    def from_description(cls, data: dict) -> Runtime:
        """The dashboard's view of the engine's runtime: the description, no strategy.

        Enough for every job's ``check_runtime`` (device count, kind, names);
        a check that needs the live devices leaves it to the engine.
        """
        description = RuntimeDescription.from_dict(data)
        return cls(strategy=None, description=description, logical_devices=list(description.devices))

    def summary(self) -> dict:
        """The compact description stored with every run."""
        description = self.description
        summary = {
            "backend": description.framework,
            "kind": description.kind,
            "strategy": description.strategy,
            "num_replicas": description.num_replicas,
            "simulated": description.simulated,
            "devices": self.device_names,
            "tf_version": description.tf_version,
            "keras_version": description.keras_version,
            "host": description.host,
        }
        if description.cluster:
            summary["cluster"] = description.cluster
        if description.framework == "jax":
            summary["jax"] = description.jax_version
        return summary
