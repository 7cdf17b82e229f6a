"""Every registered job, run once on JAX through the real ``tpudash run --framework jax``, in a session without TensorFlow.

What a Colab TPU runtime user (JAX, no TensorFlow) gets from ``tpudash run``:
each job on the 8 devices XLA splits the CPU into (tests/jax/conftest.py), to
``done``, its record kept, with the small params the TPU build's smoke test
uses (tests/tpubuild/test_jobs_smoke.py), so both cover the same jobs.
"""

from __future__ import annotations

import json

import pytest

from tests.tpubuild.test_jobs_smoke import SMALL_PARAMS
from tests.unit.test_cli import run_cli


@pytest.mark.parametrize("job", list(SMALL_PARAMS))
def test_the_job_runs_to_done_on_jax_through_the_cli(job, isolated_runs_dir):
    assignments = [part for value in SMALL_PARAMS[job] for part in ("--set", value)]
    result = run_cli("run", job, "--framework", "jax", "--tpu", "none", *assignments, "--json", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    events = [json.loads(line) for line in result.stdout.splitlines()]
    assert events[0]["type"] == "run_started" and events[0]["job"] == job
    runtime = events[0]["runtime"]
    assert (runtime["backend"], runtime["kind"], runtime["num_replicas"]) == ("jax", "CPU", 8)
    assert events[-1]["type"] == "run_finished" and events[-1]["status"] == "done", events[-1]
    recorded = json.loads(next(isolated_runs_dir.glob(f"*-{job}-*/run.json")).read_text())
    assert recorded["status"] == "done" and recorded["runtime"]["backend"] == "jax"
