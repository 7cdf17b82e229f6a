"""README's "JAX and Keras on JAX" examples, run as a user runs them, and the dashboard showing what they recorded.

Each ``python`` block after a ``run by tests/jax/test_readme_examples.py``
marker runs in a fresh process of this environment (no TensorFlow), the
runs directory set as a user's shell would set it: the Keras-on-JAX fit
under DataParallel over the 8 CPU devices, and the plain JAX loop. Both
must record a run that is done and learned; then the dashboard opens the
fit from History and its run view says what it ran on, from JAX.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from textual.widgets import Static

from jobs.events import Metric, ReplicaValues, RunStarted
from tests.conftest import REPO_ROOT
from tests.jax.test_dashboard_without_tensorflow import until
from tpudash.config import Settings
from tpudash.runs.store import RunStore
from tpudash.tui.app import TpudashApp

MARKER = "<!-- run by tests/jax/test_readme_examples.py -->"
EXAMPLE_TIMEOUT = 300


def readme_examples() -> list[str]:
    """The python blocks README marks as run by this file, in order."""
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    examples = []
    for part in text.split(MARKER)[1:]:
        block = part.lstrip()
        assert block.startswith("```python\n"), "a marked README example is not a python block"
        examples.append(block[len("```python\n") : block.index("\n```")])
    return examples


def run_example(code: str, runs_dir) -> None:
    """The example as a script in a fresh process, recording into ``runs_dir``."""
    environment = dict(os.environ, TPUDASH_RUNS_DIR=str(runs_dir))
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=EXAMPLE_TIMEOUT,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def events_of(data, kind):
    return [event for _, event in data.events if isinstance(event, kind)]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """The runs README's examples record, by job name (run once for the module)."""
    runs_dir = tmp_path_factory.mktemp("readme-runs")
    examples = readme_examples()
    assert len(examples) == 2, "README's JAX section should have its Keras-on-JAX and plain JAX examples"
    for code in examples:
        run_example(code, runs_dir)
    store = RunStore(runs_dir)
    return runs_dir, {info.job: store.load(info.run_id) for info in store.list_runs()}


def test_the_keras_on_jax_example_records_a_done_run_that_learned_over_8_devices(recorded):
    _, runs = recorded
    fit = runs["keras-on-jax"]
    assert fit.info.status == "done" and not fit.problems
    runtime = events_of(fit, RunStarted)[0].runtime
    assert (runtime["backend"], runtime["strategy"], runtime["num_replicas"]) == ("jax", "DataParallel", 8)
    val_accuracy = [metric.value for metric in events_of(fit, Metric) if metric.final_name == "val_accuracy"]
    # Chance is 0.5; the fit is seeded, and 5 epochs reach about 0.95, so 0.9
    # says it learned without resting on the last digits of XLA's arithmetic.
    assert len(val_accuracy) == 5 and val_accuracy[-1] > 0.9 and val_accuracy[-1] > val_accuracy[0]
    per_device = events_of(fit, ReplicaValues)
    assert len(per_device) == 5 and all(len(values.values) == 8 for values in per_device)


def test_the_plain_jax_example_records_its_loss_falling_and_a_value_per_device(recorded):
    _, runs = recorded
    loop = runs["jax-linear-regression"]
    assert loop.info.status == "done" and loop.info.params == {"lr": 0.1, "steps": 300}
    losses = [metric.value for metric in events_of(loop, Metric) if metric.name == "loss"]
    assert len(losses) == 300 and losses[-1] < losses[0] / 100
    (per_device,) = events_of(loop, ReplicaValues)
    assert per_device.name == "loss per device" and len(per_device.values) == 8
    assert per_device.devices == sorted(set(per_device.devices), key=per_device.devices.index)  # 8 devices
    assert max(per_device.values) < losses[0] / 100  # each device's slice fits as well as the whole


async def test_the_dashboard_shows_the_fit_with_what_it_ran_on_from_jax(recorded):
    runs_dir, runs = recorded
    fit = runs["keras-on-jax"]
    app = TpudashApp(Settings(runs_dir=runs_dir, telemetry_interval=0))
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.press("h")
        history = app.screen
        await until(pilot, lambda: fit.info.run_id in getattr(history, "runs", {}))
        table = history.query_one("#history-table")
        jobs = [table.get_row_at(index)[2] for index in range(table.row_count)]
        table.move_cursor(row=jobs.index("keras-on-jax"))
        await pilot.press("enter")
        detail = app.screen
        await until(pilot, lambda: getattr(detail, "loaded", False))
        runtime_line = str(detail.view.query_one("#run-runtime", Static).content)
        assert runtime_line.startswith(
            "on JAX 0.10.2 · 8 CPU devices (simulated) · DataParallel, 8 replicas, mesh batch=8"
        )
