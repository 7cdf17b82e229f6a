"""Shared test fixtures: one 8-device CPU runtime per process, runners, job helpers.

Logical devices can be configured only once per process, so every test that
needs TensorFlow shares the same runtime: 8 logical CPU devices under a
MirroredStrategy, the embedded default of tpudash.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# pytest-xdist's workers run with COLUMNS=80 and LINES=24 set (for their own reports); a terminal's size
# comes from its terminal, and a test that means a width sets it: the processes tests start inherit neither.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for variable in ("COLUMNS", "LINES"):
        os.environ.pop(variable, None)
# Never let a test reach for the network or a developer's real run history.
os.environ.setdefault("TFDS_DISABLE_GCS", "1")
# Test machines have no TPU chip: under the TPU build, a test that imports
# TensorFlow before tpudash does must not start libtpu (minutes of metadata
# server retries). Subprocesses that play a user get a clean environment
# (tests/unit/test_cli.py's run_cli).
from tpudash.accel.runtime import keep_libtpu_unloaded  # noqa: E402 - after the variables above

keep_libtpu_unloaded(os.environ)

import pytest
from hypothesis import HealthCheck, settings

from jobs import get_job
from jobs.events import Event, Metric, ReplicaValues, RunFinished, Table
from tpudash.config import Settings
from tpudash.engine.runner import QueuedRun, Runner
from tpudash.runs.store import RunStore

REPO_ROOT = Path(__file__).resolve().parent.parent

# A test that hangs (a job thread nobody released, a worker waiting forever)
# must not eat CI's whole time limit: after this long, print every thread's
# stack and end the session with an error.
# Property tests (Hypothesis) fuzz every boundary: run data, the tail, the
# engine protocol, serve's routes. The default run keeps their share of the ten
# minutes small; CI (HYPOTHESIS_PROFILE=ci in .ci/run) runs many more examples.
settings.register_profile("default", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

TEST_HANG_LIMIT_S = float(os.environ.get("TPUDASH_TEST_HANG_LIMIT", "600"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    def give_up() -> None:
        # Stop pytest's capture first (as pdb does), or the stacks would go
        # into a capture file nobody reads.
        capture = item.config.pluginmanager.getplugin("capturemanager")
        if capture is not None:
            capture.suspend_global_capture(in_=True)
        print(
            f"\n{item.nodeid} ran for over {TEST_HANG_LIMIT_S:.0f} s; every thread's stack:",
            file=sys.stderr,
            flush=True,
        )
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        os._exit(3)

    watchdog = threading.Timer(TEST_HANG_LIMIT_S, give_up)
    watchdog.daemon = True
    watchdog.start()
    try:
        yield
    finally:
        watchdog.cancel()


@pytest.fixture(autouse=True)
def isolated_runs_dir(tmp_path, monkeypatch):
    """Every test gets its own runs directory, XDG data home and engine lock (never a developer's dashboard's)."""
    runs_dir = tmp_path / "runs"
    monkeypatch.setenv("TPUDASH_RUNS_DIR", str(runs_dir))
    monkeypatch.setenv("TPUDASH_ENGINE_LOCK", str(tmp_path / "engine.lock"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    # Where a store's writers keep what the store has not taken yet (tpudash.runs.uploader).
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    return runs_dir


@pytest.fixture(autouse=True)
def store_outages_forgotten():
    """No test sees another's store outage (a process-wide record: ``tpudash.runs.storeclient``) or store timeout."""
    from tpudash.runs import storeclient

    # Before as well as after: a store test's writer thread still retrying when its test ended may record an
    # outage after that test's forget, and a dashboard's clocks stand still while its store is away.
    storeclient.forget_outages()
    yield
    storeclient.forget_outages()
    storeclient.set_store_timeout(None)


@pytest.fixture
def libtpu_turn(tmp_path_factory):
    """Tests whose processes may load libtpu (or hold its lock file) take turns across pytest-xdist's workers.

    libtpu admits one process per host through one lock file: a probe of another
    worker's test would be named as "the TPU is held by", not this test's own
    failure. The lock is a file in the session's temporary root, which every
    worker shares; the wait is for the other test to end, not a time.
    """
    import fcntl

    turn_path = tmp_path_factory.getbasetemp().parent / "libtpu-turn.lock"
    with open(turn_path, "a") as turn:
        fcntl.flock(turn, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(turn, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def runtime():
    """The process-wide 8-device CPU runtime."""
    from tpudash.accel.runtime import get_runtime

    return get_runtime(Settings(cpu_devices=8))


@pytest.fixture(scope="session")
def xla_on_the_host(runtime):
    """Skip unless this TensorFlow build compiles XLA for the host's CPU (tensorflow-tpu's does not: its
    fallback is tests/tpubuild's)."""
    import tensorflow as tf

    try:
        tf.function(lambda x: x * 2.0, jit_compile=True).experimental_get_compiler_ir(tf.ones([2]))(stage="hlo")
    except Exception as error:  # noqa: BLE001 - the build's own reason, shown in the skip
        pytest.skip(f"this TensorFlow build cannot compile XLA for the CPU: {type(error).__name__}: {error}"[:300])


@pytest.fixture
def settings(isolated_runs_dir, tmp_path):
    return Settings(cpu_devices=8, runs_dir=isolated_runs_dir, data_dir=tmp_path / "tfds")


@pytest.fixture
def store(isolated_runs_dir):
    return RunStore(isolated_runs_dir)


@pytest.fixture
def runner(runtime, store, settings):
    return Runner(lambda: runtime, store, settings)


@dataclass
class JobResult:
    """A finished run and every event it emitted, in order."""

    run: QueuedRun
    events: list[Event] = field(default_factory=list)

    @property
    def finished(self) -> RunFinished:
        return next(event for event in reversed(self.events) if isinstance(event, RunFinished))

    @property
    def status(self) -> str:
        return self.finished.status

    @property
    def summary(self) -> dict:
        return self.finished.summary

    def of_type(self, kind: type) -> list:
        return [event for event in self.events if isinstance(event, kind)]

    def metrics(self, name: str, split: str | None = None) -> list[Metric]:
        return [
            event for event in self.of_type(Metric) if event.name == name and (split is None or event.split == split)
        ]

    def tables(self) -> list[Table]:
        return self.of_type(Table)

    def replica_values(self, name: str | None = None) -> list[ReplicaValues]:
        return [event for event in self.of_type(ReplicaValues) if name is None or event.name == name]

    def logs(self) -> list[str]:
        return [event.text for event in self.events if event.type == "log"]


@pytest.fixture
def run_job(runner):
    """Validate ``overrides`` like the CLI does and run the job to completion.

    ``on_event(run, event)`` sees each event as it is emitted (to cancel mid-run).
    """

    def run(name: str, on_event=None, **overrides) -> JobResult:
        spec = get_job(name)
        params = spec.resolve({key: value for key, value in overrides.items()})
        events: list[Event] = []

        def collect(queued_run, event):
            events.append(event)
            if on_event is not None:
                on_event(queued_run, event)

        queued = runner.run_now(spec, params, sinks=[collect])
        return JobResult(run=queued, events=events)

    return run


@pytest.fixture
def screen_layouts(monkeypatch) -> list[str]:
    """The class name of every screen Textual lays out from now on (``Screen._refresh_layout``), in order."""
    from textual.screen import Screen

    layouts: list[str] = []
    lay_out = Screen._refresh_layout
    monkeypatch.setattr(
        Screen,
        "_refresh_layout",
        lambda screen, *a, **k: layouts.append(type(screen).__name__) or lay_out(screen, *a, **k),
    )
    return layouts
