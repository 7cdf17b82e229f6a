"""The check jobs on JAX: matmul, replica-matmul, replica-dataset, all-reduce and gradient descent.

Each runs as the engine runs it (``tpudash.engine.runner.Runner`` with a run
store) on JAX's runtime, the 8 CPU devices as one batch mesh, and is held to
the figures its TensorFlow runner gives: every device passes the matmul
check, every replica multiplies the "Use TPUs" guide's a and b into
[[22, 28], [49, 64]], range(16) doubled one value per replica, SUM 36 and
MEAN 4.5 over 8 replicas, and the Colab TPU walkthrough's gradient descent line.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def runtime():
    """JAX's runtime over the 8 CPU devices, detected once for this module (the TensorFlow one is never built)."""
    from tpudash.accel.jaxdetect import detect_jax

    return detect_jax(8, use_tpu=False)


def test_every_jax_device_passes_the_matmul_check(run_job, runtime):
    result = run_job("matmul", m=64, k=64, n=64, repeats=2)
    assert result.status == "done"
    [table] = result.tables()
    assert [row[0] for row in table.rows] == [f"CPU:{index}" for index in range(8)]
    assert [row[4] for row in table.rows] == ["pass"] * 8
    assert result.summary["all_passed"] is True
    assert set(result.summary["gflops"]) == set(runtime.device_names)
    [gflops] = result.replica_values("gflops")
    assert len(gflops.values) == 8 and min(gflops.values) > 0
