"""What a run ran on, in one line: the run view's header and ``tpudash watch`` read it from the run's record."""

from __future__ import annotations

import pytest

from tpudash.format import runtime_line

JAX_DATA_PARALLEL = {
    "backend": "jax",
    "jax": "0.10.2",
    "jaxlib": "0.10.2",
    "keras": "3.15.1",
    "kind": "CPU",
    "device_kind": "cpu",
    "device_count": 8,
    "local_device_count": 8,
    "process": {"index": 0, "count": 1},
    "strategy": "DataParallel",
    "num_replicas": 8,
    "mesh": {"axes": {"batch": 8}},
    "simulated": True,
}


def test_a_keras_on_jax_fit_reads_as_jax_its_devices_and_its_distribution():
    assert runtime_line(JAX_DATA_PARALLEL) == (
        "JAX 0.10.2 · 8 CPU devices (simulated) · DataParallel, 8 replicas, mesh batch=8 · Keras 3.15.1"
    )


def test_a_tpu_pod_slice_names_its_chip_and_this_process():
    runtime = dict(
        JAX_DATA_PARALLEL,
        kind="TPU",
        device_kind="TPU v5 lite",
        device_count=16,
        simulated=False,
        process={"index": 1, "count": 4},
        strategy="ModelParallel",
        num_replicas=4,
        mesh={"axes": {"batch": 4, "model": 4}},
    )
    assert runtime_line(runtime) == (
        "JAX 0.10.2 · 16 TPU v5 lite devices · ModelParallel, 4 replicas, mesh batch=4 model=4 · process 1 of 4 · "
        "Keras 3.15.1"
    )


def test_a_plain_jax_loop_without_a_distribution():
    runtime = {
        "backend": "jax",
        "jax": "0.10.2",
        "kind": "CPU",
        "device_count": 1,
        "strategy": "none",
        "num_replicas": 1,
    }
    assert runtime_line(runtime) == "JAX 0.10.2 · 1 CPU device · no distribution, 1 replica"


def test_a_job_reads_as_tensorflow_with_its_strategy_and_cluster():
    # What Runtime.summary() stores with every job's run.
    summary = {
        "backend": "tensorflow",
        "kind": "CPU",
        "strategy": "MultiWorkerMirroredStrategy",
        "num_replicas": 2,
        "simulated": False,
        "devices": ["/job:worker/replica:0/task:0/device:CPU:0"],
        "tf_version": "2.21.0",
        "keras_version": "3.15.1",
        "cluster": {"worker": 0, "workers": 2},
    }
    assert runtime_line(summary) == (
        "TensorFlow 2.21.0 · CPU · MultiWorkerMirroredStrategy, 2 replicas · worker 0 of 2 · Keras 3.15.1"
    )


def test_a_run_recorded_before_runtimes_named_their_framework_still_reads_as_tensorflow():
    old = {"tensorflow": "2.21.0", "kind": "CPU", "strategy": "MirroredStrategy", "num_replicas": 8, "simulated": True}
    assert runtime_line(old) == "TensorFlow 2.21.0 · CPU · MirroredStrategy, 8 replicas (simulated)"


@pytest.mark.parametrize(
    "runtime",
    [{}, {"kind": "unknown", "strategy": "none"}, {"backend": 3, "kind": None, "mesh": "x", "process": [1, 2]}],
)
def test_a_record_with_odd_or_missing_fields_gives_what_it_can_and_never_raises(runtime):
    assert isinstance(runtime_line(runtime), str)
    assert "None" not in runtime_line(runtime)
