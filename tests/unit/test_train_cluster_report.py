"""What a training run on a cluster of workers reports (issue 38, item 17): every replica's validation, and the loop.

A 2-worker run's "val accuracy per replica" listed the chief's replica only:
each worker holds only its own replicas' shares of a metric. The shares are
now gathered over the cluster (a collective, ``shares_gatherer``), checked
here on the shared 8-replica CPU runtime, where the gathered rows must be
each replica's own; tests/cluster/test_train_workers.py checks the real
2-worker run. And "loop=fit asked" was said with ``loop`` left alone: its
default is ``auto`` now, and only a ``fit`` the user asked for is warned of.
"""

from __future__ import annotations

import pytest

from jobs.trainreport import Evaluator, shares_gatherer
from jobs.trainworkers import FIT_UNDER_MWMS, cluster_replica_devices, training_loop

TWO_WORKERS = {"workers": 2, "worker": 0, "jobs": {"worker": 2}, "addresses": ["127.0.0.1:1", "127.0.0.1:2"]}
CHIEF_AND_TWO = {"workers": 3, "worker": 1, "jobs": {"chief": 1, "worker": 2}}


@pytest.mark.parametrize(
    "local, cluster, devices",
    [
        (
            ["/job:worker/replica:0/task:0/device:CPU:0"],
            TWO_WORKERS,
            ["/job:worker/replica:0/task:0/device:CPU:0", "/job:worker/replica:0/task:1/device:CPU:0"],
        ),
        (  # worker 1's own view names the same cluster, in the same order
            ["/job:worker/replica:0/task:1/device:CPU:0"],
            {**TWO_WORKERS, "worker": 1},
            ["/job:worker/replica:0/task:0/device:CPU:0", "/job:worker/replica:0/task:1/device:CPU:0"],
        ),
        (  # two replicas a worker: worker 0's both, then worker 1's
            ["/job:worker/replica:0/task:0/device:GPU:0", "/job:worker/replica:0/task:0/device:GPU:1"],
            TWO_WORKERS,
            [
                "/job:worker/replica:0/task:0/device:GPU:0",
                "/job:worker/replica:0/task:0/device:GPU:1",
                "/job:worker/replica:0/task:1/device:GPU:0",
                "/job:worker/replica:0/task:1/device:GPU:1",
            ],
        ),
        (  # a chief: first, then the workers by task
            ["/job:worker/replica:0/task:0/device:CPU:0"],
            CHIEF_AND_TWO,
            [
                "/job:chief/replica:0/task:0/device:CPU:0",
                "/job:worker/replica:0/task:0/device:CPU:0",
                "/job:worker/replica:0/task:1/device:CPU:0",
            ],
        ),
        (  # a device named without its task, and a cluster described without its jobs
            ["/device:CPU:0"],
            {"workers": 2, "worker": 0},
            ["/job:worker/replica:0/task:0/device:CPU:0", "/job:worker/replica:0/task:1/device:CPU:0"],
        ),
    ],
)
def test_every_replica_of_the_cluster_is_named_in_replica_order(local, cluster, devices):
    assert cluster_replica_devices(local, cluster) == devices


@pytest.mark.parametrize(
    "asked, cluster, loop, warning",
    [
        ("auto", None, "fit", None),
        ("fit", None, "fit", None),
        ("custom", None, "custom", None),
        ("auto", TWO_WORKERS, "custom", None),  # the default: no word about a fit nobody asked for
        ("custom", TWO_WORKERS, "custom", None),
        ("fit", TWO_WORKERS, "custom", FIT_UNDER_MWMS),
    ],
)
def test_the_loop_warning_is_only_for_a_fit_the_user_asked_for_on_a_cluster(asked, cluster, loop, warning):
    assert training_loop(asked, cluster) == (loop, warning)
    assert FIT_UNDER_MWMS.startswith("loop=fit asked, but Keras 3's fit fails under MultiWorkerMirroredStrategy")


def test_the_loop_param_defaults_to_auto_and_takes_each_loop():
    from jobs.train import SPECS

    (spec,) = [spec for spec in SPECS if spec.name == "train"]
    assert spec.resolve({})["loop"] == "auto"
    assert [spec.resolve({"loop": loop})["loop"] for loop in ("auto", "fit", "custom")] == ["auto", "fit", "custom"]
    assert "auto: fit, or custom on several workers" in spec.param("loop").help


def _evaluator_with_shares(runtime):
    """An Evaluator's metrics on the 8-replica runtime, replica i having seen i + 1 examples of loss i."""
    import keras
    import tensorflow as tf

    strategy = runtime.strategy
    evaluator = Evaluator.__new__(Evaluator)
    evaluator.strategy = strategy
    with strategy.scope():
        evaluator.loss = keras.metrics.Mean(name="loss")
        evaluator.accuracy = keras.metrics.SparseCategoricalAccuracy(name="accuracy")

    def replica_step():
        replica = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group, tf.float32)
        seen = tf.fill(tf.cast(tf.reshape(replica + 1, (1,)), tf.int32), replica)
        evaluator.loss.update_state(seen)
        # Right on every other replica: accuracy 1 on even replicas, 0 on odd ones.
        label = tf.cast(tf.math.floormod(replica, 2.0), tf.int32)
        evaluator.accuracy.update_state(tf.zeros((1,), tf.int32) + label, tf.constant([[1.0, 0.0]]))

    @tf.function
    def step():
        strategy.run(replica_step)

    step()
    return evaluator


def test_gathered_shares_are_each_replicas_own_in_replica_order(runtime):
    import tensorflow as tf

    evaluator = _evaluator_with_shares(runtime)
    evaluator.gather_shares = None
    local = evaluator.per_replica()
    replicas = runtime.strategy.num_replicas_in_sync
    assert local["loss"] == pytest.approx([float(replica) for replica in range(replicas)])
    assert local["accuracy"] == [1.0 if replica % 2 == 0 else 0.0 for replica in range(replicas)]

    gather = shares_gatherer(tf, runtime.strategy, (evaluator.loss, evaluator.accuracy))
    rows = runtime.strategy.experimental_local_results(gather())[0].numpy().tolist()
    assert [row[1] for row in rows] == [float(replica + 1) for replica in range(replicas)]  # each one's own count
    evaluator.gather_shares = gather
    assert evaluator.per_replica() == local
