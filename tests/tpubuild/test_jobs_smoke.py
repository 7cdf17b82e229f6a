"""Every registered job, run once through the real ``tpudash run`` entry point with small params.

CI runs this with the TPU build ([tpu]) on a host without a chip, where every
job must work on the CPU default without libtpu ever starting. Under the CPU
build the default run already runs every job (tests/unit), so it is not part
of it; ``pytest tests/tpubuild/test_jobs_smoke.py`` runs it there too.
"""

from __future__ import annotations

import json

import pytest

from jobs import registry
from tests.unit.test_cli import run_cli

SMALL_PARAMS = {
    "matmul": ["m=64", "k=32", "n=16", "repeats=1"],
    "replica-matmul": [],
    "replica-dataset": [],
    "all-reduce": ["size_mb=0.25", "repeats=2", "warmup=1"],
    "gradient-descent": [],
    "train": ["source=synthetic", "epochs=1", "limit_train=1024", "limit_test=256", "batch_per_replica=16"],
    "dtensor-mlp": ["source=synthetic", "epochs=1", "hidden=32,16", "limit_train=512", "limit_test=256"],
}


def test_every_registered_job_has_smoke_params():
    assert set(SMALL_PARAMS) == set(registry())


@pytest.mark.parametrize("job", list(SMALL_PARAMS))
def test_the_job_runs_to_done_through_the_installed_cli(job, isolated_runs_dir):
    assignments = [part for value in SMALL_PARAMS[job] for part in ("--set", value)]
    result = run_cli("run", job, *assignments, "--json", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    events = [json.loads(line) for line in result.stdout.splitlines()]
    assert events[0]["type"] == "run_started" and events[0]["job"] == job
    assert events[0]["runtime"]["num_replicas"] == 8
    assert events[-1]["type"] == "run_finished" and events[-1]["status"] == "done"
    recorded = json.loads(next(isolated_runs_dir.glob(f"*-{job}-*/run.json")).read_text())
    assert recorded["status"] == "done"
