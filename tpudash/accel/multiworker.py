"""Many workers on TensorFlow's own engine: TF_CONFIG → MultiWorkerMirroredStrategy, bounded when a peer is lost.

When ``TF_CONFIG`` describes a cluster of more than one task, the runtime's
strategy is ``tf.distribute.MultiWorkerMirroredStrategy`` (``make_strategy``).
A lost peer must fail the collectives within a stated time, never hang:

- TensorFlow's coordination service (the chief hosts it) expects a heartbeat
  from every task; when one stops for ``HEARTBEAT_TIMEOUT_SECONDS`` it aborts
  every collective of the cluster with UnavailableError naming the task
  ("The following tasks are unhealthy (stopped sending heartbeats):
  /job:worker/replica:0/task:1"). Measured with TF 2.21 on loopback, kill -9
  of worker 1 of 2: the chief's step raised after 10.6 s with TF's default
  (10 s) and 2.8 s with a 3 s heartbeat timeout. tpudash sets it explicitly
  (the service is configured before the strategy, which then keeps it).
- ``CommunicationOptions(timeout_seconds=COLLECTIVE_TIMEOUT_SECONDS)`` is the
  backstop for a peer that is alive but stuck (it still heartbeats): one
  collective waiting longer fails with DeadlineExceededError. It is long,
  as the first step of a worker may wait for another still tracing its model.
- A worker that never joins fails the strategy's start after
  ``JOIN_TIMEOUT_SECONDS`` (the service's registration timeout).

On CPU, MultiWorkerMirroredStrategy uses one device per worker (``CPU:0``):
the CPU is not split into logical devices, and each worker is one replica.

On a TPU pod there is no TF_CONFIG: TensorFlow runs one client (worker 0,
``--tpu <pod name>``) whose ``TPUClusterResolver`` lists the pod's hosts and
whose ``TPUStrategy`` drives every host; ``pod_topology`` turns the resolver
and the initialized topology into hosts × chips for the Devices screen.

``agree_on_run_id`` is a collective: every worker gets the chief's proposal.
TensorFlow is passed in or imported lazily; importing this module is cheap.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from tpudash.runs.workers import read_tf_config, worker_in_cluster

HEARTBEAT_TIMEOUT_SECONDS = 5.0
"""A task silent this long is declared lost by TensorFlow's coordination service."""
COLLECTIVE_TIMEOUT_SECONDS = 120.0
"""The longest one collective may wait for its peers (a peer alive but stuck)."""
JOIN_TIMEOUT_SECONDS = 180.0
"""How long the cluster waits for every worker to start (cold TensorFlow imports on a loaded host)."""
LOST_WORKER_DEADLINE_SECONDS = 15.0
"""The stated time: a worker's step fails this soon after a peer is lost (heartbeat timeout plus margin)."""
SHUTDOWN_BARRIER_TIMEOUT_SECONDS = 10.0
"""How long a worker's exit waits for the others at the coordination service's shutdown barrier."""
TRAINING_TASKS = ("chief", "worker")
RUN_ID_BYTES = 256
"""The longest run id ``agree_on_run_id`` carries (a run id is about 40 characters)."""


@dataclass(frozen=True)
class ClusterTask:
    """This process's place in a TF_CONFIG cluster."""

    task_type: str
    task_index: int
    worker: int
    """0..workers-1; the chief (or worker 0 when there is no chief) is 0."""
    workers: int
    addresses: tuple[str, ...]
    """Every training task's address in worker order (the chief first)."""
    jobs: tuple[tuple[str, int], ...]
    """Every job of the cluster with its task count, e.g. (("chief", 1), ("worker", 2))."""

    @property
    def is_chief(self) -> bool:
        return self.worker == 0

    @property
    def address(self) -> str:
        return self.addresses[self.worker]

    def worker_of_task(self, task_type: str, task_index: int) -> int | None:
        """The worker number of ``/job:<task_type>/task:<task_index>``; None when it trains nothing."""
        if task_type == "chief":
            return task_index if task_index == 0 else None
        if task_type == "worker":
            return task_index + (1 if dict(self.jobs).get("chief") else 0)
        return None

    def to_dict(self) -> dict:
        values = asdict(self)
        values["addresses"] = list(self.addresses)
        values["jobs"] = dict(self.jobs)
        return values


def cluster_from_tf_config(environ: Mapping[str, str]) -> ClusterTask | None:
    """This process's task when ``TF_CONFIG`` describes a cluster of more than one task, else None.

    A malformed TF_CONFIG raises ValueError naming the field and what is allowed;
    a parameter-server cluster is refused (its strategy is not supported here).
    """
    found = read_tf_config(environ)
    if found is None:
        return None
    cluster, task = found
    if sum(len(tasks) for tasks in cluster.values()) <= 1:
        return None
    unknown = sorted(set(cluster) - set(TRAINING_TASKS) - {"evaluator"})
    if unknown:
        raise ValueError(
            f"TF_CONFIG.cluster: task type(s) {', '.join(unknown)} not supported (a parameter-server cluster); "
            f"allowed: chief, worker (MultiWorkerMirroredStrategy)"
        )
    if len(cluster.get("chief") or []) > 1:
        raise ValueError(f"TF_CONFIG.cluster.chief: {len(cluster['chief'])} chiefs; allowed: one")
    identity = worker_in_cluster(cluster, task, "TF_CONFIG")
    if identity is None:
        raise ValueError("TF_CONFIG.task.type: an evaluator does not train; allowed here: chief, worker")
    task_type, index = task["type"], task.get("index", 0)
    addresses = tuple(cluster.get("chief") or []) + tuple(cluster.get("worker") or [])
    jobs = tuple((name, len(cluster[name])) for name in TRAINING_TASKS if name in cluster)
    return ClusterTask(task_type, index, identity.index, len(addresses), addresses, jobs)


def configure_coordination_service(cluster: ClusterTask, heartbeat_timeout: float, join_timeout: float) -> None:
    """TensorFlow's coordination service with our heartbeat and join timeouts (before the strategy exists).

    The strategy configures the service itself only when none is configured,
    with TensorFlow's defaults; this is the same configuration with the
    timeouts tpudash states. It must run before TensorFlow's context starts.
    """
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
    from tensorflow.python.eager import context

    leader_job = "chief" if dict(cluster.jobs).get("chief") else "worker"
    context.context().configure_coordination_service(
        service_type="standalone",
        service_leader=f"/job:{leader_job}/replica:0/task:0",
        heartbeat_timeout_in_ms=int(heartbeat_timeout * 1000),
        cluster_register_timeout_in_ms=int(join_timeout * 1000),
        shutdown_barrier_timeout_in_ms=int(SHUTDOWN_BARRIER_TIMEOUT_SECONDS * 1000),
        coordinated_jobs=[
            coordination_config_pb2.CoordinatedJob(name=name, num_tasks=count) for name, count in cluster.jobs
        ],
    )


def make_strategy(
    tf: Any,
    cluster: ClusterTask,
    heartbeat_timeout: float = HEARTBEAT_TIMEOUT_SECONDS,
    collective_timeout: float = COLLECTIVE_TIMEOUT_SECONDS,
    join_timeout: float = JOIN_TIMEOUT_SECONDS,
    configure: Any = None,
) -> Any:
    """MultiWorkerMirroredStrategy over TF_CONFIG's cluster, failing within a stated time when a peer is lost.

    Blocks until every worker has joined (at most ``join_timeout``).
    ``configure`` is replaced in tests that pass a stand-in TensorFlow.
    """
    (configure or configure_coordination_service)(cluster, heartbeat_timeout, join_timeout)
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=collective_timeout)
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


def cluster_description(cluster: ClusterTask, heartbeat_timeout: float, collective_timeout: float) -> dict:
    """What the runtime description carries about the cluster (JSON)."""
    values = cluster.to_dict()
    values.update(
        heartbeat_timeout_seconds=heartbeat_timeout,
        collective_timeout_seconds=collective_timeout,
        lost_worker_deadline_seconds=LOST_WORKER_DEADLINE_SECONDS,
    )
    return values


def is_multi_worker(strategy: Any) -> bool:
    """Whether ``strategy`` spans several processes (a MultiWorkerMirroredStrategy with a cluster)."""
    # TensorFlow's class is CollectiveAllReduceStrategy; only one made over a cluster has a cluster spec.
    return bool(getattr(getattr(strategy, "extended", None), "_cluster_spec", None))


def agree_on_run_id(strategy: Any, proposed: str) -> str:
    """The chief's ``proposed`` run id, on every worker (a collective: every worker must call it).

    The global replica 0 (on the chief) contributes the UTF-8 bytes of its
    proposal and every other replica zeros; the sum over the cluster is the
    chief's bytes. One process (any other strategy) returns ``proposed``.
    """
    encoded = proposed.encode("utf-8")
    if not encoded or len(encoded) > RUN_ID_BYTES or b"\0" in encoded:
        raise ValueError(f"run id: {proposed!r:.80} cannot be shared; allowed: 1 to {RUN_ID_BYTES} bytes, no NUL")
    if not is_multi_worker(strategy):
        return proposed
    import tensorflow as tf

    mine = tf.constant(list(encoded.ljust(RUN_ID_BYTES, b"\0")), dtype=tf.int32)

    def contribution():
        first = tf.distribute.get_replica_context().replica_id_in_sync_group == 0
        return tf.where(first, mine, tf.zeros_like(mine))

    agreed = strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(contribution), axis=None)
    return bytes(int(value) for value in agreed.numpy()).rstrip(b"\0").decode("utf-8")


def pod_topology(resolver: Any, topology: Any) -> dict | None:
    """A TPU's topology as hosts × chips: hosts from the resolver's cluster spec, chips per host from the topology.

    ``resolver.cluster_spec()``'s tasks of job "worker" are the hosts (a pod's
    resolver lists every TPU VM); the initialized topology gives the mesh, its
    last dimension the cores per chip, and TPU cores per host
    (``num_tpus_per_task``). Falls back to the topology's task count when
    the resolver lists no workers.
    """
    if topology is None:
        return None
    try:
        mesh = [int(size) for size in topology.mesh_shape]
        tasks = int(topology.num_tasks)
        cores_per_host = int(topology.num_tpus_per_task)
    except Exception:  # noqa: BLE001 - topology is informative only
        return None
    hosts: list[str] = []
    try:
        spec = resolver.cluster_spec()
        listed = spec.as_dict() if hasattr(spec, "as_dict") else dict(spec)
        workers = listed.get("worker") or []
        hosts = list(workers.values()) if isinstance(workers, dict) else list(workers)
    except Exception:  # noqa: BLE001 - a resolver that cannot list its cluster (local) leaves the topology's count
        hosts = []
    cores_per_chip = mesh[-1] if len(mesh) == 4 and mesh[-1] > 0 else 1
    chips_per_host = max(1, cores_per_host // cores_per_chip)
    host_count = len(hosts) or tasks
    return {
        "mesh_shape": mesh,
        "num_tasks": tasks,
        "num_tpus_per_task": cores_per_host,
        "hosts": host_count,
        "host_addresses": [str(host) for host in hosts],
        "chips_per_host": chips_per_host,
        "cores_per_chip": cores_per_chip,
        "chips": host_count * chips_per_host,
    }
