"""One job, two frameworks: the runner runs a job's JAX runner on a JAX runtime, and a job without one says why.

No TensorFlow and no JAX: the runtimes are stand-ins that say which framework
they are, as ``tpudash.accel.description.Runtime.framework`` does.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from jobs import registry
from jobs.base import FrameworkNotSupported, JobSpec, Param
from tpudash.accel.description import LogicalDeviceInfo, Runtime, RuntimeDescription
from tpudash.engine.runner import Runner


class StandInRuntime:
    """A runtime of one framework; the runner needs only ``summary()`` and ``framework``."""

    def __init__(self, framework: str) -> None:
        self.framework = framework

    def summary(self):
        return {"backend": self.framework, "kind": "CPU", "strategy": "Mesh", "num_replicas": 8}


def on_tensorflow(ctx, params):
    return {"ran_on": "tensorflow", "steps": params["steps"]}


def on_jax(ctx, params):
    return {"ran_on": "jax", "steps": params["steps"]}


STEPS = (Param("steps", "int", 2, minimum=1),)
BOTH = JobSpec("both", "Both", "runs on either framework", STEPS, on_tensorflow, run_jax=on_jax)
TF_ONLY = JobSpec(
    "tf-only", "TF only", "TensorFlow's own API", STEPS, on_tensorflow, not_on_jax="it demonstrates tf.data's API"
)


@pytest.mark.parametrize("framework", ["tensorflow", "jax"])
def test_the_runtimes_framework_picks_the_jobs_runner_with_the_same_params(store, framework):
    run = Runner(lambda: StandInRuntime(framework), store).run_now(BOTH, {"steps": 3})
    assert run.state == "done"
    assert store.load(run.run_id).info.summary == {"ran_on": framework, "steps": 3}


def test_a_job_without_a_jax_runner_fails_on_jax_saying_why_and_records_nothing(store):
    run = Runner(lambda: StandInRuntime("jax"), store).run_now(TF_ONLY, {"steps": 1})
    assert run.state == "failed"
    assert run.error == "FrameworkNotSupported: job 'tf-only' does not run on jax: it demonstrates tf.data's API"
    assert store.list_runs() == []


def test_a_job_lists_the_frameworks_it_runs_on_and_why_not_the_other():
    assert BOTH.describe()["frameworks"] == ["tensorflow", "jax"] and BOTH.describe()["not_on_jax"] is None
    assert TF_ONLY.describe()["frameworks"] == ["tensorflow"]
    assert TF_ONLY.describe()["not_on_jax"] == "it demonstrates tf.data's API"
    with pytest.raises(FrameworkNotSupported, match="does not run on mxnet: allowed: tensorflow, jax"):
        BOTH.runner_for("mxnet")


def test_a_jax_runtimes_description_crosses_to_the_dashboard_with_its_device_rows():
    device = LogicalDeviceInfo(
        0, "TPU:0", "TPU", platform="tpu", device_kind="TPU v5 lite", process_index=0, coords=[0, 0, 0]
    )
    description = RuntimeDescription(
        kind="TPU", strategy="Mesh", num_replicas=1, devices=[device], framework="jax", jax_version="0.10.2"
    )
    again = Runtime.from_description(json.loads(json.dumps(description.to_dict())))
    assert again.framework == "jax"
    assert again.description.devices == [device]
    assert again.summary()["backend"] == "jax" and again.summary()["jax"] == "0.10.2"
    # an engine of another version may send fields this one does not know: they are left out, not fatal
    data = description.to_dict()
    data["devices"][0]["hbm_channels"] = 4
    assert Runtime.from_description(data).description.devices == [device]


def test_every_job_tpudash_ships_names_a_jax_runner_that_loads_without_a_framework():
    """Each job's JAX runner is named as an entry point, found, and its module imports neither JAX nor TensorFlow."""
    code = (
        "import sys, json; from jobs import registry; "
        "runners = {name: spec.runner_for('jax').__module__ for name, spec in registry().items()}; "
        "print(json.dumps([runners, sorted(m for m in ('jax', 'tensorflow', 'keras') if m in sys.modules)]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    runners, frameworks_loaded = json.loads(done.stdout)
    assert set(runners) == set(registry())
    assert all(module.startswith("jobs.on_jax.") for module in runners.values()), runners
    assert frameworks_loaded == []
