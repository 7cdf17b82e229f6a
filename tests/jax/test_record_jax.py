"""A plain JAX loop recorded with ``tpudash.record``: its runtime, values read without a host sync, per-device values.

Eight CPU devices stand in for a TPU board (tests/jax/conftest.py).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import keras
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import tpudash
from jobs.events import Log, Metric, ReplicaValues, RunStarted
from tpudash.recording import RecordingError, per_replica_parts, session_runtime
from tpudash.runs.model import RunModel


def only_run(store):
    (run_id,) = store.run_ids()
    return store.load(run_id)


def events_of(data, kind):
    return [event for _, event in data.events if isinstance(event, kind)]


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((8,), ("batch",))


@pytest.fixture(scope="module")
def slow_step():
    """A jitted step that keeps the CPU busy for a good fraction of a second: its result is not ready at once."""

    @jax.jit
    def step(matrix):
        for _ in range(3):
            matrix = jnp.tanh(matrix @ matrix) * 0.5
        return matrix.mean()

    matrix = jnp.full((900, 900), 0.01, dtype=jnp.float32)
    step(matrix).block_until_ready()  # compiled once, outside any timing
    return lambda: step(matrix)


# -- the runtime -----------------------------------------------------------------------------------


def test_a_jax_session_is_described_from_jax_devices_and_processes():
    runtime = session_runtime()
    assert runtime["backend"] == "jax" and "tensorflow" not in runtime
    assert (runtime["jax"], runtime["jaxlib"]) == (jax.__version__, jax.__version__)
    assert (runtime["kind"], runtime["device_count"], runtime["local_device_count"]) == ("CPU", 8, 8)
    assert runtime["devices"] == [str(device) for device in jax.devices()]
    assert runtime["process"] == {"index": 0, "count": 1}
    assert (runtime["strategy"], runtime["num_replicas"], runtime["simulated"]) == ("none", 1, True)
    assert "mesh" not in runtime and "problem" not in runtime


def test_a_mesh_or_a_keras_distribution_gives_the_strategy_replicas_and_mesh(mesh):
    by_mesh = session_runtime(mesh)
    assert (by_mesh["strategy"], by_mesh["num_replicas"], by_mesh["mesh"]) == ("Mesh", 8, {"axes": {"batch": 8}})

    data_parallel = keras.distribution.DataParallel(devices=jax.devices())
    described = session_runtime(data_parallel)
    assert (described["strategy"], described["num_replicas"]) == ("DataParallel", 8)
    assert described["mesh"] == {"axes": {"batch": 8}}

    device_mesh = keras.distribution.DeviceMesh((4, 2), ["batch", "model"], jax.devices())
    model_parallel = keras.distribution.ModelParallel(
        layout_map=keras.distribution.LayoutMap(device_mesh), batch_dim_name="batch"
    )
    described = session_runtime(model_parallel)
    assert (described["strategy"], described["num_replicas"]) == ("ModelParallel", 4)
    assert described["mesh"] == {"axes": {"batch": 4, "model": 2}}


def test_the_distribution_keras_trains_under_is_found_without_being_passed():
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=jax.devices()))
    try:
        described = session_runtime(backend="jax")
    finally:
        keras.distribution.set_distribution(None)
    assert (described["strategy"], described["num_replicas"]) == ("DataParallel", 8)


def test_record_with_a_mesh_writes_the_jax_runtime_into_the_run(store, mesh):
    with tpudash.record("sharded loop", strategy=mesh) as run:
        run.metric("loss", 1.0)
    (started,) = events_of(only_run(store), RunStarted)
    assert (started.runtime["backend"], started.runtime["strategy"], started.runtime["num_replicas"]) == (
        "jax",
        "Mesh",
        8,
    )
    assert started.runtime["mesh"] == {"axes": {"batch": 8}}


# -- values without a host sync --------------------------------------------------------------------


def test_a_jax_loss_is_recorded_without_waiting_for_the_device(store, slow_step):
    run = tpudash.record("async loop")
    loss = slow_step()
    assert not loss.is_ready(), "the step should still be running: make it slower"
    run.metric("loss", loss, step=0)
    # Had metric read the number, the computation would be over by now.
    still_running = not loss.is_ready()
    run.finish()
    assert still_running
    (metric,) = events_of(only_run(store), Metric)
    assert metric.value == pytest.approx(float(loss)) and metric.step == 0


def test_jax_values_land_in_the_order_of_the_calls_nan_included(store, slow_step):
    with tpudash.record("ordered") as run:
        run.metric("loss", slow_step(), step=0)  # still computing while the next calls come in
        run.log("after the slow loss")
        run.metric("loss", jnp.float32(float("nan")), step=1)
        run.metric("accuracy", jnp.array([0.5]), step=1)  # one element counts as a scalar
        run.metric("loss", 0.25, step=2)
    data = only_run(store)
    written = [event for _, event in data.events if isinstance(event, (Metric, Log))]
    assert [getattr(event, "name", None) or event.text for event in written] == [
        "loss",
        "after the slow loss",
        "loss",
        "accuracy",
        "loss",
    ]
    assert math.isnan(written[2].value) and written[3].value == 0.5 and written[4].value == 0.25
    assert data.info.status == "done" and data.info.final_metrics["loss"] == 0.25


def test_a_jax_value_lands_while_the_run_is_open(store):
    run = tpudash.record("live")
    run.metric("loss", jnp.float32(2.5), step=0)
    run.flush()  # waits for the value, then writes it
    model = RunModel.from_events(store.load(run.run_id).events)
    assert model.final_metrics["loss"] == 2.5
    run.finish()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (jnp.ones(3), "value: a JAX array of shape (3,) is not a scalar; allowed: shape () or one element"),
        (jnp.array(True), "value: a JAX array of dtype bool is not a number"),
    ],
)
def test_a_jax_array_that_is_not_one_number_is_refused_at_the_call(store, value, message):
    with tpudash.record("refusals") as run:
        with pytest.raises(RecordingError, match=message.replace("(", r"\(").replace(")", r"\)")):
            run.metric("loss", value)
        run.metric("loss", 1.0)
    assert [event.value for event in events_of(only_run(store), Metric)] == [1.0]


def test_recording_inside_a_jitted_function_says_to_record_its_result(store):
    with tpudash.record("traced") as run:

        @jax.jit
        def step(x):
            run.metric("loss", x)
            return x

        with pytest.raises(RecordingError, match="value: a traced JAX value .* recorded after the call"):
            step(jnp.float32(1.0))


def test_a_failed_read_is_a_warning_and_the_run_goes_on(store):
    class Unreadable:
        pass

    with tpudash.record("unreadable") as run:
        run._emit_later(lambda: Metric("loss", float(Unreadable()), 0), "loss at step 0")  # type: ignore[arg-type]
        run.metric("loss", 1.0, step=1)
    data = only_run(store)
    (warning,) = [event for event in events_of(data, Log) if event.level == "warning"]
    assert warning.text.startswith("loss at step 0: its value could not be read from the device (TypeError")
    assert data.info.status == "done" and [event.step for event in events_of(data, Metric)] == [1]


# -- one value per device --------------------------------------------------------------------------


def test_a_sharded_array_gives_one_value_per_device_named_by_it(mesh):
    sharded = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("batch")))
    values, devices = per_replica_parts(sharded)
    assert values == [float(index) for index in range(8)]
    assert devices == [str(device) for device in jax.devices()]


def test_a_pmap_output_and_a_list_of_jax_scalars_are_per_replica_values(store):
    doubled = jax.pmap(lambda x: x * 2.0)(jnp.arange(8.0))
    pairs = jax.pmap(lambda x: x + 1.0)(jnp.zeros((8, 2)))
    with tpudash.record("pmap loop") as run:
        run.replica_values("doubled", doubled)
        run.replica_values("pairs", pairs)
        run.replica_values("listed", [jnp.float32(index) for index in range(3)])
    doubled_event, pairs_event, listed_event = events_of(only_run(store), ReplicaValues)
    assert doubled_event.values == [2.0 * index for index in range(8)]
    assert doubled_event.devices == [str(device) for device in jax.devices()]
    assert pairs_event.values == [[[1.0, 1.0]]] * 8  # each device's shard: one row of two
    assert (listed_event.values, listed_event.devices) == ([0.0, 1.0, 2.0], ["replica 0", "replica 1", "replica 2"])


def test_replica_values_do_not_wait_for_the_device(store, slow_step, mesh):
    run = tpudash.record("async replicas")
    loss = slow_step()
    per_device = jax.device_put(jnp.broadcast_to(loss, (8,)), NamedSharding(mesh, P("batch")))
    run.replica_values("loss per device", per_device)
    still_running = not loss.is_ready()
    run.finish()
    assert still_running
    (event,) = events_of(only_run(store), ReplicaValues)
    assert event.values == [pytest.approx(float(loss))] * 8
