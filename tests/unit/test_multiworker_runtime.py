"""TF_CONFIG in the runtime: which cluster this process is in, the strategy it gets, how it is described, and a lost peer in words.

No cluster is started: detection runs against the stand-in TensorFlow of
test_runtime.py, with TensorFlow's coordination service left unconfigured.
The messages a lost peer produces are TensorFlow 2.21's own, as measured on
loopback (tests/cluster runs the real thing).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from jobs.base import ParamError
from jobs.trainworkers import check_workers, lost_worker_message
from tests.unit.test_runtime import FakeTensorFlow, host
from tpudash.accel import multiworker
from tpudash.accel.description import Runtime, RuntimeDescription
from tpudash.accel.multiworker import cluster_from_tf_config
from tpudash.accel.runtime import detect
from tpudash.accel.startup import RuntimeSetupError

ADDRESSES = ["127.0.0.1:4100", "127.0.0.1:4101"]


def tf_config(cluster: dict, task_type: str = "worker", index: int = 0) -> dict[str, str]:
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})}


class MultiWorkerTensorFlow(FakeTensorFlow):
    """The stand-in TensorFlow with MultiWorkerMirroredStrategy: one CPU replica per worker."""

    def __init__(self, workers: int, **kwargs):
        super().__init__(**kwargs)
        self.options = []
        fake = self

        class CommunicationOptions:
            def __init__(self, timeout_seconds=None):
                fake.options.append(timeout_seconds)

        class CollectiveAllReduceStrategy:
            def __init__(self, communication_options=None):
                self.num_replicas_in_sync = workers
                self.extended = SimpleNamespace(worker_devices=("/job:worker/replica:0/task:1/device:CPU:0",))

        self.distribute.MultiWorkerMirroredStrategy = CollectiveAllReduceStrategy
        self.distribute.experimental = SimpleNamespace(CommunicationOptions=CommunicationOptions)
        logical = self.config.list_logical_devices

        def list_logical_devices(kind):
            if kind == "CPU":
                return [SimpleNamespace(name="/job:worker/replica:0/task:1/device:CPU:0", device_type="CPU")]
            return logical(kind)

        self.config.list_logical_devices = list_logical_devices


@pytest.fixture
def coordination(monkeypatch):
    """The coordination service's configuration, recorded instead of made (it would start this process's TF)."""
    calls = []
    monkeypatch.setattr(multiworker, "configure_coordination_service", lambda *args: calls.append(args))
    return calls


def test_a_tf_config_of_one_task_or_none_is_no_cluster():
    assert cluster_from_tf_config({}) is None
    assert cluster_from_tf_config(tf_config({"worker": ADDRESSES[:1]})) is None


def test_workers_are_numbered_with_the_chief_first():
    cluster = cluster_from_tf_config(tf_config({"chief": ["10.0.0.1:2222"], "worker": ADDRESSES}, "worker", 1))
    assert (cluster.worker, cluster.workers, cluster.is_chief) == (2, 3, False)
    assert cluster.addresses == ("10.0.0.1:2222", *ADDRESSES)
    assert cluster.address == "127.0.0.1:4101"
    alone = cluster_from_tf_config(tf_config({"worker": ADDRESSES}, "worker", 0))
    assert (alone.worker, alone.is_chief) == (0, True)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("{not json", "TF_CONFIG: not JSON"),
        (json.dumps({"cluster": {"worker": "127.0.0.1:1"}}), "TF_CONFIG.cluster: must map"),
        (json.dumps({"cluster": {"worker": ADDRESSES}, "task": {"type": "boss", "index": 0}}), "TF_CONFIG.task.type"),
        (
            json.dumps({"cluster": {"worker": ADDRESSES}, "task": {"type": "worker", "index": 2}}),
            "TF_CONFIG.task.index",
        ),
        (json.dumps({"cluster": {"worker": ADDRESSES, "ps": ["h:1"]}, "task": {"type": "worker"}}), "ps not supported"),
    ],
)
def test_a_malformed_tf_config_names_the_field(text, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        cluster_from_tf_config({"TF_CONFIG": text})


def test_tf_config_gives_multi_worker_mirrored_strategy_on_one_cpu_device_per_worker(coordination):
    tf = MultiWorkerTensorFlow(workers=2)
    runtime = detect(environ=tf_config({"worker": ADDRESSES}, "worker", 1), host=host(), tf=tf)
    description = runtime.description
    assert (description.kind, description.num_replicas, description.simulated) == ("CPU", 2, False)
    assert description.strategy_text() == "MultiWorkerMirroredStrategy, worker 1 of 2"
    assert description.cluster_text().startswith("127.0.0.1:4100, 127.0.0.1:4101 (this worker); one replica per worker")
    assert "a lost worker fails the run within 15 s" in description.cluster_text()
    assert [device.name for device in description.devices] == ["/job:worker/replica:0/task:1/device:CPU:0"]
    assert tf._cpu_split == 1  # the CPU was not split into 8 logical devices
    assert any("one CPU device per worker" in note for note in description.notes)
    # The timeouts tpudash states reach TensorFlow.
    assert coordination[0][1:] == (multiworker.HEARTBEAT_TIMEOUT_SECONDS, multiworker.JOIN_TIMEOUT_SECONDS)
    assert tf.options == [multiworker.COLLECTIVE_TIMEOUT_SECONDS]
    # The dashboard gets the description as JSON and shows the same.
    again = Runtime.from_description(json.loads(json.dumps(description.to_dict()))).description
    assert again.strategy_text() == "MultiWorkerMirroredStrategy, worker 1 of 2"
    assert runtime.summary()["cluster"]["addresses"] == ADDRESSES


def test_the_chief_is_said_to_be_the_chief(coordination):
    runtime = detect(environ=tf_config({"worker": ADDRESSES}, "worker", 0), host=host(), tf=MultiWorkerTensorFlow(2))
    assert runtime.description.strategy_text() == "MultiWorkerMirroredStrategy, worker 0 of 2 (chief)"


def test_a_malformed_tf_config_stops_detection_naming_the_field(coordination):
    with pytest.raises(RuntimeSetupError, match=r"TF_CONFIG\.task\.index: 5 is not allowed; allowed: 0 to 1"):
        detect(environ=tf_config({"worker": ADDRESSES}, "worker", 5), host=host(), tf=MultiWorkerTensorFlow(2))
    assert coordination == []


def test_an_explicit_tpu_wins_over_tf_config_as_a_pod_runs_one_client(coordination):
    runtime = detect(
        tpu="grpc://10.0.0.2:8470", environ=tf_config({"worker": ADDRESSES}), host=host(), tf=MultiWorkerTensorFlow(2)
    )
    assert (runtime.description.kind, runtime.description.cluster) == ("TPU", None)
    assert coordination == []


def test_a_worker_that_cannot_join_the_cluster_says_which_worker_it_is(coordination):
    tf = MultiWorkerTensorFlow(2)

    def refuse(communication_options=None):
        raise RuntimeError("Address already in use\nmore")

    tf.distribute.MultiWorkerMirroredStrategy = refuse
    with pytest.raises(
        RuntimeSetupError, match=r"worker 1 of 2 \(127\.0\.0\.1:4101\) failed: .*Address already in use$"
    ):
        detect(environ=tf_config({"worker": ADDRESSES}, "worker", 1), host=host(), tf=tf)


CLUSTER = {"worker": 0, "workers": 2, "addresses": ADDRESSES, "jobs": {"worker": 2}}
# TensorFlow 2.21's words on the chief, 5.3 s after kill -9 of worker 1 (heartbeat timeout 5 s).
HEARTBEAT_LOST = (
    "{{function_node __wrapped__CollectiveReduceV2_Nordering_token_1_device_/job:worker/replica:0/task:0/device:CPU:0}}"
    " Collective ops is aborted by: Error reported from /job:worker/task:1: The following tasks are unhealthy "
    "(stopped sending heartbeats):\n/job:worker/replica:0/task:1\nThe tasks have crashed. [Op:CollectiveReduceV2] name: "
)
# …and on worker 1 at once when the chief is killed.
SOCKET_CLOSED = (
    "Collective ops is aborted by: Socket closed\nAdditional GRPC error information from remote target "
    "/job:worker/replica:0/task:0 while calling /tensorflow.WorkerService/RecvBuf"
)


class UnavailableError(Exception):
    """Named as TensorFlow's is."""


def test_a_lost_peer_is_named_with_its_address():
    message = lost_worker_message(UnavailableError(HEARTBEAT_LOST), CLUSTER)
    assert message.startswith("worker 1 (127.0.0.1:4101) was lost (this is worker 0 of 2): UnavailableError: ")
    assert "stopped sending heartbeats" in message and "function_node" not in message and "[Op:" not in message
    on_worker_1 = lost_worker_message(UnavailableError(SOCKET_CLOSED), dict(CLUSTER, worker=1))
    assert on_worker_1.startswith("worker 0 (127.0.0.1:4100) was lost (this is worker 1 of 2)")


def test_a_peer_tensorflow_does_not_name_is_a_peer_worker():
    message = lost_worker_message(UnavailableError("Collective ops is aborted by: timed out"), CLUSTER)
    assert message.startswith("a peer worker was lost (this is worker 0 of 2): UnavailableError: Collective ops")


def test_more_than_one_worker_outside_a_cluster_is_refused_naming_workers():
    alone = SimpleNamespace(
        description=RuntimeDescription(kind="CPU", strategy="MirroredStrategy", num_replicas=8, devices=[])
    )
    with pytest.raises(ParamError, match="workers: 2 worker processes are started by the launcher") as refused:
        check_workers({"workers": 2}, alone)
    assert refused.value.field == "workers"
    check_workers({"workers": 1}, alone)
    in_cluster = SimpleNamespace(
        description=RuntimeDescription("CPU", "MultiWorkerMirroredStrategy", 2, [], cluster=CLUSTER)
    )
    with pytest.raises(ParamError, match="workers: 3 disagrees with the cluster"):
        check_workers({"workers": 3}, in_cluster)
    check_workers({"workers": 2}, in_cluster)
