"""A TPU pod from one worker: ``--tpu <pod name>`` through TPUClusterResolver, its topology shown as hosts × chips.

TensorFlow runs one client on a pod: worker 0 connects through the resolver,
whose cluster spec lists every TPU VM (the hosts), and TPUStrategy drives
them all. The stand-in TensorFlow of test_runtime.py plays a v4-32 (4 hosts
× 4 chips, one core per chip) and a v5e-16 with a resolver that lists no
workers.
"""

from __future__ import annotations

from types import SimpleNamespace

from screens.devices import describe_runtime
from tests.unit.test_runtime import FakeTensorFlow, LogicalDevice, host
from tpudash.accel.runtime import detect

POD_HOSTS = ["10.130.0.2:8470", "10.130.0.3:8470", "10.130.0.4:8470", "10.130.0.5:8470"]


class PodTensorFlow(FakeTensorFlow):
    """A pod of ``len(hosts)`` TPU VMs with ``chips`` chips each, ``cores`` cores per chip."""

    def __init__(self, hosts: list[str], chips: int, cores: int, mesh: list[int], listed: bool = True):
        per_host = chips * cores
        super().__init__(tpu_cores=len(hosts) * per_host)
        fake = self
        resolver_class = self.distribute.cluster_resolver.TPUClusterResolver

        class PodResolver(resolver_class):
            def cluster_spec(self):
                if not listed:
                    raise ValueError("the resolver lists no workers")
                return SimpleNamespace(as_dict=lambda: {"worker": list(hosts)})

        def initialize(resolver):
            fake.calls.append(("initialize", resolver.tpu))
            return SimpleNamespace(mesh_shape=mesh, num_tasks=len(hosts), num_tpus_per_task=per_host)

        def list_logical_devices(kind):
            if kind != "TPU":
                return []
            return [
                LogicalDevice(f"/job:worker/replica:0/task:{task}/device:TPU:{task * per_host + core}", "TPU")
                for task in range(len(hosts))
                for core in range(per_host)
            ]

        self.distribute.cluster_resolver.TPUClusterResolver = PodResolver
        self.tpu.experimental.initialize_tpu_system = initialize
        self.config.list_logical_devices = list_logical_devices


def test_a_pod_of_four_hosts_of_four_chips_is_shown_as_hosts_times_chips():
    tf = PodTensorFlow(POD_HOSTS, chips=4, cores=1, mesh=[2, 2, 4, 1])
    runtime = detect(tpu="my-v4-32", environ={}, host=host(), tf=tf)
    description = runtime.description
    assert (description.kind, description.strategy, description.num_replicas) == ("TPU", "TPUStrategy", 16)
    assert [call[0] for call in tf.calls] == ["resolver", "connect", "initialize"]  # one client, from worker 0
    assert description.topology_text() == "4 hosts × 4 chips (16 chips, 1 core each), mesh [2, 2, 4, 1]"
    assert description.topology["host_addresses"] == POD_HOSTS
    assert sorted({device.task for device in description.devices}) == [0, 1, 2, 3]
    screen = describe_runtime(description).plain
    assert "TPU topology  4 hosts × 4 chips (16 chips, 1 core each), mesh [2, 2, 4, 1]" in screen
    assert "TPU hosts  " + ", ".join(POD_HOSTS) in screen


def test_a_resolver_that_lists_no_hosts_leaves_the_topologys_task_count():
    tf = PodTensorFlow(["a", "b", "c", "d"], chips=4, cores=1, mesh=[4, 4, 1, 1], listed=False)
    description = detect(tpu="my-v5e-16", environ={}, host=host(), tf=tf).description
    assert description.topology_text() == "4 hosts × 4 chips (16 chips, 1 core each), mesh [4, 4, 1, 1]"
    assert description.topology["host_addresses"] == []
    assert "TPU hosts" not in describe_runtime(description).plain
