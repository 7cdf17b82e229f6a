"""Per-replica jobs reproduce the published figures: [[22, 28], [49, 64]], doubled ranges, SUM 36 / MEAN 4.5."""

from __future__ import annotations

import math

import numpy as np
import pytest

from jobs import get_job
from jobs.base import ParamError
from jobs.events import Progress
from jobs.replicas import replica_dataset_plan
from tpudash.cli import main as cli


def run_dirs(runs_dir):
    return (
        [path for path in runs_dir.iterdir() if path.is_dir() and not path.name.startswith(".")]
        if runs_dir.exists()
        else []
    )


def cancel_on_first_progress(run, event):
    if isinstance(event, Progress):
        run.cancel_event.set()


# -- replica-matmul -------------------------------------------------------------


def test_replica_matmul_defaults_give_the_use_tpus_guides_product_on_every_replica(run_job, runtime):
    result = run_job("replica-matmul")
    assert result.status == "done"
    [product] = result.replica_values("product")
    assert product.values == [[[22, 28], [49, 64]]] * 8
    assert [device.rpartition("device:")[2] for device in product.devices] == [f"CPU:{index}" for index in range(8)]
    [table] = result.tables()
    assert [row[-1] for row in table.rows] == ["pass"] * 8
    assert result.summary["agree"] is True and result.summary["matches_reference"] is True
    assert result.summary["reference"] == [[22, 28], [49, 64]]
    assert "every replica agrees with the reference: [[22, 28], [49, 64]]" in result.logs()


def run_random_replica_matmul(run_job):
    """replica-matmul on seeded random 5×7 and 7×4 inputs; every replica's product checked against NumPy's."""
    result = run_job("replica-matmul", source="random", m=5, k=7, n=4, seed=3)
    assert result.status == "done"
    generator = np.random.default_rng(3)
    a = generator.standard_normal((5, 7), dtype=np.float32)
    b = generator.standard_normal((7, 4), dtype=np.float32)
    [product] = result.replica_values("product")
    assert len(product.values) == 8
    for matrix in product.values:
        np.testing.assert_allclose(matrix, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5, atol=1e-6)
    return result


def test_replica_matmul_with_random_inputs_matches_numpy_on_every_replica(run_job):
    result = run_random_replica_matmul(run_job)
    assert result.summary["agree"] is True


def test_replica_matmul_large_random_inputs_report_errors_not_matrices(run_job):
    result = run_job("replica-matmul", source="random", m=64, k=32, n=16)
    assert result.status == "done"
    assert result.replica_values("product") == []
    [errors] = result.replica_values("max abs error")
    assert len(errors.values) == 8 and max(errors.values) < 1e-4


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"source": "file"}, "source"),
        ({"source": "random", "m": "0"}, "m"),
        ({"source": "random", "k": "-1"}, "k"),
        ({"m": "4"}, "source"),  # a shape only applies to random inputs
    ],
)
def test_replica_matmul_rejects_bad_params(overrides, field):
    with pytest.raises(ParamError) as raised:
        get_job("replica-matmul").resolve(overrides)
    assert raised.value.field == field


def test_replica_matmul_honours_cancel(run_job, store):
    result = run_job("replica-matmul", on_event=cancel_on_first_progress)
    assert result.status == "cancelled"
    assert store.load(result.run.run_id).info.status == "cancelled"
    assert result.replica_values() == []


# -- replica-dataset ------------------------------------------------------------


def test_replica_dataset_defaults_double_range_16_one_value_per_replica(run_job):
    result = run_job("replica-dataset")
    assert result.status == "done"
    assert [event.values for event in result.replica_values("inputs step 0")] == [[[value] for value in range(0, 8)]]
    assert [event.values for event in result.replica_values("outputs step 0")] == [
        [[value] for value in range(0, 16, 2)]
    ]
    assert [event.values for event in result.replica_values("inputs step 1")] == [[[value] for value in range(8, 16)]]
    assert [event.values for event in result.replica_values("outputs step 1")] == [
        [[value] for value in range(16, 32, 2)]
    ]
    assert result.replica_values("outputs step 2") == []
    assert result.summary["outputs_per_step"] == [[0, 2, 4, 6, 8, 10, 12, 14], [16, 18, 20, 22, 24, 26, 28, 30]]
    assert [event.done for event in result.of_type(Progress)] == [0, 1, 2]


def run_short_last_batch(run_job):
    """replica-dataset squaring range(20), 2 per replica: 16 then a short last batch of 4, split as TensorFlow splits it."""
    result = run_job("replica-dataset", n=20, per_replica=2, fn="square")
    assert result.status == "done"
    assert result.summary["global_batch"] == 16 and result.summary["steps"] == 2
    [first] = result.replica_values("outputs step 0")
    assert first.values[0] == [0, 1] and first.values[7] == [14**2, 15**2]
    # experimental_distribute_dataset gives the last 4 elements one each to the first 4 replicas.
    [last_inputs] = result.replica_values("inputs step 1")
    [last_outputs] = result.replica_values("outputs step 1")
    assert last_inputs.values == [[16], [17], [18], [19], [], [], [], []]
    assert last_outputs.values == [[256], [289], [324], [361], [], [], [], []]
    return result


def test_replica_dataset_squares_several_values_per_replica_and_a_short_last_batch(run_job):
    run_short_last_batch(run_job)


@pytest.mark.parametrize(("n", "per_replica"), [(25, 2), (17, 3)])
def test_tensorflow_splits_each_batch_as_the_plan_the_jax_runner_follows(run_job, n, per_replica):
    result = run_job("replica-dataset", n=n, per_replica=per_replica, fn="identity")
    plan = replica_dataset_plan(n, per_replica, 8)
    assert [result.replica_values(f"inputs step {step}")[0].values for step in range(len(plan))] == plan
    # A short last batch: ceil(size / replicas) elements to each replica in turn, the last ones left empty.
    assert plan[-1][-1] == [] and all(len(values) == math.ceil(len(sum(plan[-1], [])) / 8) for values in plan[-1][:4])


def test_replica_dataset_identity_passes_the_range_through(run_job):
    result = run_job("replica-dataset", n=8, fn="identity")
    assert result.summary["outputs_per_step"] == [list(range(8))]


@pytest.mark.parametrize(
    ("overrides", "field"),
    [({"n": "0"}, "n"), ({"per_replica": "0"}, "per_replica"), ({"fn": "cube"}, "fn"), ({"n": "ten"}, "n")],
)
def test_replica_dataset_rejects_bad_params(overrides, field):
    with pytest.raises(ParamError) as raised:
        get_job("replica-dataset").resolve(overrides)
    assert raised.value.field == field


def test_replica_dataset_honours_cancel_between_steps(run_job, store):
    result = run_job("replica-dataset", on_event=cancel_on_first_progress)
    assert result.status == "cancelled"
    assert store.load(result.run.run_id).info.status == "cancelled"
    assert result.replica_values() == []


# -- all-reduce --------------------------------------------------------------------


def test_all_reduce_sum_is_36_and_mean_4_5_over_8_replicas(run_job):
    result = run_job("all-reduce", size_mb=0.25, repeats=2, warmup=1)
    assert result.status == "done"
    assert result.summary["sum"] == 36 and result.summary["mean"] == 4.5
    assert result.summary["replica_sum"] == 36 and result.summary["replica_mean"] == 4.5
    [contributions] = result.replica_values("contribution")
    assert contributions.values == [1, 2, 3, 4, 5, 6, 7, 8]
    assert result.replica_values("all_reduce SUM")[0].values == [36] * 8
    assert result.replica_values("all_reduce MEAN")[0].values == [4.5] * 8
    checks, timing = result.tables()
    assert [row[-1] for row in checks.rows] == ["pass"] * 4
    assert [row[:2] for row in checks.rows] == [
        ["replica context all_reduce", "SUM"],
        ["replica context all_reduce", "MEAN"],
        ["strategy.reduce", "SUM"],
        ["strategy.reduce", "MEAN"],
    ]
    size_bytes, replicas, median_ms, algorithm_gbps, _ = timing.rows[0]
    assert size_bytes == 2**18 and replicas == 8
    assert median_ms > 0 and algorithm_gbps > 0
    assert result.summary["bytes"] == 2**18


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"size_mb": "0"}, "size_mb"),
        ({"size_mb": "-2"}, "size_mb"),
        ({"size_mb": "huge"}, "size_mb"),
        ({"repeats": "0"}, "repeats"),
    ],
)
def test_all_reduce_rejects_bad_params(overrides, field):
    with pytest.raises(ParamError) as raised:
        get_job("all-reduce").resolve(overrides)
    assert raised.value.field == field


def test_all_reduce_honours_cancel_between_repeats(run_job, store):
    def cancel_after_first_repeat(run, event):
        if isinstance(event, Progress) and event.done == 1:
            run.cancel_event.set()

    result = run_job("all-reduce", size_mb=0.25, repeats=50, warmup=0, on_event=cancel_after_first_repeat)
    assert result.status == "cancelled"
    assert store.load(result.run.run_id).info.status == "cancelled"
    assert max(event.done for event in result.of_type(Progress)) == 1


def test_the_cli_exits_2_for_a_bad_value_and_creates_no_run(isolated_runs_dir, capsys):
    assert cli.main(["run", "replica-dataset", "--set", "fn=cube"]) == 2
    assert "fn: 'cube' is not allowed; allowed: one of double, square, identity" in capsys.readouterr().err
    assert run_dirs(isolated_runs_dir) == []
