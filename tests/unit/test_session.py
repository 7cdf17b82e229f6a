"""The dashboard's session without Textual: launch validation, status text, the quit flow, the runs directory, telemetry.

The view is a plain object that keeps what the session shows and runs what
it hands to the UI thread when the test says so; the engine is scripted, as
in ``tests/unit/test_lane.py``; the lane's clock is the test's, so the
cancel grace period before quitting is exact, with no waiting.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import threading
import time

import pytest

from jobs.base import JobSpec, Param
from jobs.events import Metric, RunFinished, RunStarted, Telemetry
from tpudash.accel import hostcheck
from tpudash.childproc import decode_line, encode_line
from tpudash.config import Settings
from tpudash.engine.handle import EngineExit, EngineHandle
from tpudash.engine.protocol import (
    REPLIES,
    Cancel,
    Command,
    JobFinished,
    JobStarted,
    Reply,
    RuntimeReady,
    decode,
    encode,
)
from tpudash.runs.layout import SOURCE_CALLBACK, TELEMETRY_FILE
from tpudash.runs.store import RunStore
from tpudash.tui.session import MAX_WAITING_RUNS, DashboardSession

STEPS = JobSpec("steps", "Steps", "counts", (Param("steps", "int", 3, minimum=1),), run=lambda ctx, params: {})
ENGINE_PID = 4242
DESCRIPTION = {"kind": "CPU", "strategy": "MirroredStrategy", "num_replicas": 8, "devices": [], "simulated": False}


class FakeView:
    """What the app is to the session: its reactives, its notices, and a UI thread the test drives."""

    def __init__(self):
        self.runtime_status = "connecting…"
        self.engine_status = "none"
        self.lane_status = "idle"
        self.runtime = None
        self.runtime_error = None
        self.framework_missing = None
        self.device_check = None
        self.shown_run_id = None
        self.lane_version = 0
        self.runs_version = 0
        self.telemetry = None
        self.runtime_settled = asyncio.Event()
        self.notices: list[tuple[str, str, str]] = []
        self.pending: list = []
        self.pending_lock = threading.Lock()
        self.handed = threading.Condition(self.pending_lock)
        self.redraws = 0
        self.run_view_shown = 0
        self.host_check = None
        self.questions: list = []
        """Every question asked (question, yes, no, the callback that takes the answer)."""

    def notify(self, message, *, title="", severity="information", timeout=None):
        self.notices.append((severity, title, message))

    def call_later(self, callback, *args, **kwargs) -> bool:
        with self.handed:
            self.pending.append((callback, args, kwargs))
            self.handed.notify_all()
        return True

    def wait_for_pending(self, timeout: float) -> bool:
        """Block until another thread hands the UI thread something; False after ``timeout``."""
        with self.handed:
            return self.handed.wait_for(lambda: self.pending, timeout)

    def run_pending(self) -> int:
        """Run what was handed to the UI thread so far; how many callbacks ran."""
        with self.pending_lock:
            pending, self.pending = self.pending, []
        for callback, args, kwargs in pending:
            callback(*args, **kwargs)
        return len(pending)

    def redraw_now(self) -> None:
        self.redraws += 1

    def show_run_view(self) -> None:
        self.run_view_shown += 1

    def ask(self, question, *, yes, no, answered) -> None:
        self.questions.append((question, yes, no, answered))

    def titles(self) -> list[str]:
        return [title for _, title, _ in self.notices]


class ScriptedEngine(EngineHandle):
    """Records what the session's lane sends; the test plays the engine's side."""

    def __init__(self, listener):
        super().__init__(listener)
        self.pid = ENGINE_PID
        self.sent: list[Command] = []
        self.killed = False

    def send(self, command: Command) -> bool:
        self.sent.append(command)
        return True

    def release(self) -> None:
        self.release_requested = True

    def kill(self, reason: str) -> None:
        self.kill_reason = reason
        self.killed = True

    @property
    def alive(self) -> bool:
        return not (self.killed or self.release_requested)

    def say(self, message: Reply) -> None:
        self._listener(decode(decode_line(encode_line(encode(message))), REPLIES))

    def exit(self, returncode: int | None, signal_name: str | None = None) -> None:
        requested = self.release_requested or self.kill_reason is not None
        self._listener(EngineExit(returncode, signal_name, ["the last line"], requested))


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeSampler:
    """Stands in for ``TelemetrySampler``: a fixed sample, the history it keeps, whether it was closed."""

    def __init__(self):
        self.history: collections.deque = collections.deque(maxlen=10)
        self.processes_asked: list[dict] = []
        self.closed = threading.Event()

    def sample(self, processes=None):
        self.processes_asked.append(dict(processes or {}))
        stamp, sample = time.time(), Telemetry(chips=[], host={"cpu_pct": [1.0]})
        self.history.append((stamp, sample))
        return stamp, sample

    def close(self) -> None:
        self.closed.set()


@pytest.fixture
def view():
    return FakeView()


@pytest.fixture
def engines():
    return []


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def make_session(settings, view, engines, clock):
    def make(**options) -> DashboardSession:
        def start(listener):
            engine = ScriptedEngine(listener)
            engines.append(engine)
            return engine

        options.setdefault("job_specs", {"steps": STEPS})
        return DashboardSession(options.pop("settings", settings), view, engine_factory=start, clock=clock, **options)

    return make


def engine_says(session: DashboardSession, view: FakeView, engine: ScriptedEngine, message) -> None:
    """The engine's reply arrives on its reader thread; the UI thread polls the lane when woken."""
    if isinstance(message, EngineExit):
        engine._listener(message)
    else:
        engine.say(message)
    view.run_pending()


def run_started(session, view, engine, store: RunStore, live):
    engine_says(session, view, engine, RuntimeReady(DESCRIPTION))
    recorder = store.create(live.run_id, live.job, STEPS.as_text(live.params), DESCRIPTION)
    recorder.record(RunStarted(live.run_id, live.job, live.params, DESCRIPTION, 1.0))
    recorder.record(Metric("loss", 0.5, 0))
    engine_says(session, view, engine, JobStarted(live.run_id, str(store.root / live.run_id)))
    return recorder


# -- launch validation ----------------------------------------------------------------------------------


def test_a_launch_is_refused_with_the_reason_for_an_unknown_job_bad_params_or_no_tensorflow(
    make_session, view, engines, store
):
    session = make_session()
    assert session.launch_by_name("nope") is None
    assert view.notices[-1] == ("error", "Unknown job", "job 'nope' is not installed; available: steps")
    assert session.launch_by_name("steps", {"steps": "0"}) is None
    assert view.notices[-1][:2] == ("error", "steps: bad params")
    view.framework_missing = "no TensorFlow: pip install tensorflow-cpu"
    assert session.launch_by_name("steps") is None
    assert view.notices[-1] == ("error", "steps not launched: no TensorFlow", view.framework_missing)
    # Refused before the lane: no engine, no run directory.
    assert engines == [] and not session.busy and store.list_runs() == []


def test_a_launch_queues_shows_the_run_and_the_queue_has_a_limit(make_session, view, engines):
    session = make_session()
    first = session.launch_by_name("steps", {"steps": "5"})
    assert first is not None and first.params == {"steps": 5}
    assert view.shown_run_id == first.run_id and view.run_view_shown == 1 and view.lane_version == 1
    assert len(engines) == 1 and view.engine_status == "starting…"
    waiting = [session.launch_by_name("steps") for _ in range(MAX_WAITING_RUNS)]
    assert all(live is not None for live in waiting)
    assert view.notices[-1] == ("information", "Queued", "steps queued behind steps")
    assert session.launch_by_name("steps") is None
    assert view.notices[-1] == (
        "warning",
        "Queue full",
        f"{MAX_WAITING_RUNS} runs are already waiting; cancel one or wait.",
    )
    assert len(session.live_runs) == 1 + MAX_WAITING_RUNS


# -- status text --------------------------------------------------------------------------------------------


def test_the_status_lines_follow_the_runtime_the_running_job_the_queue_and_the_last_end(
    make_session, view, engines, store
):
    session = make_session()
    live = session.launch_by_name("steps")
    session.launch_by_name("steps")
    engine = engines[0]
    recorder = run_started(session, view, engine, store, live)
    assert view.runtime_settled.is_set()
    assert view.runtime_status == "CPU · MirroredStrategy · 8 replicas"
    assert view.engine_status == "running steps"
    assert session.lane_status_text(session.lane).startswith("steps ● running ")
    assert session.lane_status_text(session.lane).endswith(" · 1 queued")

    recorder.record(RunFinished("failed", {}, error="ValueError: boom"))
    engine_says(session, view, engine, JobFinished(live.run_id, "failed", "ValueError: boom"))
    assert ("error", "steps failed", "ValueError: boom") in view.notices
    session.cancel_latest()  # the next run was sent on; cancelling it before it began ends it unrecorded
    engine_says(session, view, engine, JobFinished(session.lane.current.run_id, "cancelled", None))
    text = session.lane_status_text(session.lane)
    assert text.startswith("last: steps cancelled ("), text

    engine_says(session, view, engine, EngineExit(-9, "SIGKILL", ["killed"], False))
    assert view.engine_status == "crashed (SIGKILL)"
    assert "Engine crashed" in view.titles()


def test_a_runtime_without_tensorflow_is_said_once_and_everything_but_launching_works(make_session, view, engines):
    from tpudash.engine.protocol import RuntimeFailed

    session = make_session()
    session.engine_needed()
    session.host_checked(None)  # a scan that failed gates nothing: the engine starts and finds no TensorFlow
    engine_says(
        session, view, engines[0], RuntimeFailed(error="no module", message="install it", missing_tensorflow=True)
    )
    assert view.runtime_status == "no TensorFlow" and view.framework_missing == "install it"
    assert view.runtime is None and view.runtime_settled.is_set()
    assert view.titles() == ["No TensorFlow: jobs cannot run"]


# -- the quit flow ------------------------------------------------------------------------------------------


def test_quit_asks_only_while_runs_are_running_or_waiting(make_session, view, engines, store):
    session = make_session()
    assert session.quit_question() is None
    first = session.launch_by_name("steps")
    # Sent to the engine at once, so it counts as running while the engine starts.
    assert session.quit_question() == "steps is running. Quitting cancels it and records it as cancelled."
    session.launch_by_name("steps")
    run_started(session, view, engines[0], store, first)
    assert session.quit_question() == (
        "steps is running and 1 more wait. Quitting cancels it and records it as cancelled."
    )


def test_a_confirmed_quit_cancels_everything_and_ends_the_engine_after_the_grace_period(
    make_session, view, engines, store, clock, settings
):
    session = make_session(settings=dataclasses.replace(settings, cancel_grace=2.0))
    live = session.launch_by_name("steps")
    waiting = session.launch_by_name("steps")
    engine = engines[0]
    run_started(session, view, engine, store, live)

    session.begin_quit()
    assert session.quitting and not session.stopped
    assert Cancel(live.run_id) in engine.sent and waiting.settled.is_set()
    assert view.titles()[-1] == "Quit"
    assert view.lane_status == "stopping: cancelling steps…"
    assert session.launch_by_name("steps") is None  # nothing new starts while quitting

    clock.now += 1.0
    session.tick()
    assert not engine.killed
    clock.now += 1.5
    session.tick()
    assert engine.killed and engine.kill_reason == "steps did not stop within 2 s of cancel"
    engine_says(session, view, engine, EngineExit(-9, "SIGKILL", [], True))
    assert session.stopped and live.model.status == "cancelled"

    session.close()
    assert engine.release_requested is False  # the engine had already gone: nothing left to release


def test_quit_with_nothing_launched_is_stopped_at_once_and_close_releases_a_warm_engine(make_session, engines):
    session = make_session()
    session.engine_needed()
    session.host_checked(host_check())
    session.begin_quit()
    assert session.stopped
    session.close()
    assert engines[0].release_requested


# -- runs written elsewhere ------------------------------------------------------------------------------


def test_a_run_live_in_the_runs_directory_is_announced_once_and_bumps_the_runs_version(make_session, view, store):
    session = make_session()
    session.scan_runs_directory()
    view.run_pending()
    assert view.runs_version == 0 and session.live_on_disk == []

    recorder = store.create("20260101-000000-fit-abcdef", "fit", {}, DESCRIPTION, source=SOURCE_CALLBACK)
    session.scan_runs_directory()
    view.run_pending()
    assert [info.run_id for info in session.live_on_disk] == ["20260101-000000-fit-abcdef"]
    assert view.runs_version == 1
    said = [message for _, title, message in view.notices if title == "A run is live"]
    assert said == [f"fit, from model.fit with TpudashCallback in pid {store.list_runs()[0].pid}. Press w to watch it."]
    # Its directory gets telemetry while it is live.
    assert session.telemetry.targets[0] == (store.root / "20260101-000000-fit-abcdef",)

    session.scan_runs_directory()
    view.run_pending()
    assert len([title for title in view.titles() if title == "A run is live"]) == 1
    recorder.record(RunFinished("done", {}))
    recorder.close()
    session.scan_runs_directory()
    view.run_pending()
    assert session.live_on_disk == [] and view.runs_version == 2


def test_an_unreadable_runs_directory_is_said_once_while_the_scans_go_on(make_session, view, monkeypatch):
    from tpudash.runs.follow import RunsDirectoryWatch

    def refuse(self):
        raise PermissionError(13, "Permission denied", str(self.store.root))

    monkeypatch.setattr(RunsDirectoryWatch, "scan", refuse)
    session = make_session()
    for _ in range(3):
        session.scan_runs_directory()
        view.run_pending()
    assert view.notices == [
        (
            "error",
            "Cannot read the runs directory",
            f"PermissionError: [Errno 13] Permission denied: '{session.store.root}'",
        )
    ]


# -- telemetry -------------------------------------------------------------------------------------------------


def test_the_telemetry_thread_samples_into_live_runs_and_the_view_until_close(make_session, view, engines, store):
    sampler = FakeSampler()
    session = make_session(
        settings=Settings(runs_dir=store.root, telemetry_interval=0.05), telemetry_sampler=lambda settings: sampler
    )
    live = session.launch_by_name("steps")
    run_started(session, view, engines[0], store, live)
    thread = session.start_telemetry()

    deadline = time.monotonic() + 10
    while view.telemetry is None or len(session.telemetry.history) < 2:
        assert view.wait_for_pending(deadline - time.monotonic()), "no sample reached the view"
        view.run_pending()
    stamp, sample = view.telemetry
    assert isinstance(sample, Telemetry) and sample.host == {"cpu_pct": [1.0]}
    assert {"engine": ENGINE_PID} in sampler.processes_asked  # the engine's memory is read with each sample

    session.close()
    thread.join(5)
    assert not thread.is_alive() and sampler.closed.is_set()
    assert (store.root / live.run_id / TELEMETRY_FILE).exists()


def test_telemetry_closed_before_its_thread_began_never_samples(make_session):
    sampler = FakeSampler()
    session = make_session(telemetry_sampler=lambda settings: sampler)
    session.close()
    thread = session.start_telemetry()
    thread.join(5)
    assert not thread.is_alive() and not sampler.history


# -- beside another process that holds the TPU, or without TensorFlow -----------------------------------------

JAX_HOLDER = hostcheck.TpuHolder(1234, "python train.py", ("/dev/accel0",), "JAX")
OTHER_DASHBOARDS_ENGINE = hostcheck.TpuHolder(999, "/usr/bin/python3 -m tpudash.engine", ("/dev/accel0",), "TensorFlow")


def host_check(*, chips: int = 0, tensorflow: bool = True, holders=(), jax: bool = False) -> dict:
    """``HostCheck.to_dict()`` of a host: ``chips`` TPU v4 chips, TensorFlow or not, JAX or not, these processes
    holding the TPU."""
    scanned = hostcheck.Chips("TPU v4 chip", chips, 32, 1) if chips else hostcheck.Chips()
    distributions = {"tensorflow-tpu": "2.20.0", "libtpu": "0.0.17"} if tensorflow else {}
    found = hostcheck.inspect(chip_scan=lambda: scanned, distributions=lambda: distributions, holders=lambda: holders)
    found.tensorflow_found = tensorflow  # whatever this test process has importable
    found.jax_found = jax
    found.diagnoses = hostcheck.diagnose(scanned, distributions, found.holders, tensorflow_found=tensorflow)
    return found.to_dict()


class HostScans:
    """The session's host check: what the host looks like now (a test changes ``holders`` between looks)."""

    def __init__(self, holders=()):
        self.holders = list(holders)
        self.looks = 0

    def __call__(self):
        self.looks += 1
        check = host_check(chips=4, holders=tuple(self.holders))
        return type("Scanned", (), {"to_dict": lambda _self: check})()


def test_the_devices_need_waits_for_the_host_check_and_starts_the_engine_where_nothing_stands_in_its_way(
    make_session, view, engines
):
    session = make_session()
    session.engine_needed()
    assert engines == []  # the host check is a few ms away
    session.host_checked(host_check(chips=4))
    assert len(engines) == 1 and view.host_check["chips"]["count"] == 4
    session.host_checked(host_check(chips=4))  # a later look starts nothing more
    assert len(engines) == 1


def test_without_tensorflow_the_host_check_refuses_launches_and_starts_no_engine(make_session, view, engines, store):
    session = make_session()
    session.engine_needed()
    session.host_checked(host_check(tensorflow=False))
    assert engines == [] and view.runtime_status == "no TensorFlow or JAX" and view.runtime_settled.is_set()
    tensorflow_line, jax_line = view.framework_missing.splitlines()
    assert tensorflow_line.endswith('pip install "tensorflow>=2.20,<2.22"')
    assert jax_line == 'or run the jobs on JAX instead: pip install "jax[cpu]>=0.10.2,<0.11" "keras>=3.15,<4"'
    assert view.titles() == ["No TensorFlow or JAX: jobs cannot run"]
    session.engine_needed()  # Devices shown again
    assert session.launch_by_name("steps") is None
    assert engines == [] and view.titles()[-1] == "steps not launched: no TensorFlow or JAX"
    assert store.list_runs() == []  # no run directory


def test_beside_a_jax_process_no_engine_starts_and_a_launch_asks_to_run_on_the_cpu(make_session, view, engines, store):
    scans = HostScans([JAX_HOLDER])
    session = make_session(host_check_provider=scans)
    session.engine_needed()
    session.host_checked(session.inspect_host())
    assert engines == [] and view.runtime_settled.is_set()
    assert view.runtime_status == "TPU held by JAX (pid 1234)"
    assert view.runtime_error.startswith("The TPU is held by the JAX process pid 1234 (python train.py);")
    assert "asks to run on the CPU (8 logical devices)" in view.runtime_error
    assert view.titles() == ["The TPU is in use"]

    assert session.launch_by_name("steps") is None
    (question, yes, no, answer) = view.questions[-1]
    assert question == (
        "The TPU is held by the JAX process pid 1234 (python train.py); libtpu admits one process per host. "
        "Run steps on the CPU (8 logical devices) instead?"
    )
    assert (yes, no) == ("Run on the CPU", "Cancel") and scans.looks == 2  # looked again at launch
    answer(False)
    assert engines == [] and not session.live_runs and view.titles()[-1] == "Cancelled"
    assert store.list_runs() == []  # no run directory

    session.launch_by_name("steps")
    view.questions[-1][3](True)
    assert len(engines) == 1 and session.engine_settings.tpu == "none"
    assert view.runtime_status == "connecting…" and view.runtime_error is None
    assert [live.job for live in session.live_runs.values()] == ["steps"]
    session.launch_by_name("steps")  # the choice holds: no second question
    assert len(view.questions) == 2 and len(session.live_runs) == 2


def test_a_holder_gone_by_launch_time_or_another_dashboards_engine_launches_as_usual(make_session, view, engines):
    scans = HostScans([JAX_HOLDER])
    session = make_session(host_check_provider=scans)
    session.host_checked(session.inspect_host())
    scans.holders = [OTHER_DASHBOARDS_ENGINE]  # the JAX script ended; another dashboard's engine took the TPU
    live = session.launch_by_name("steps")
    assert live is not None and view.questions == [] and len(engines) == 1
    assert session.engine_settings.tpu is None and view.runtime_status == "connecting…"


def test_re_initialising_forgets_the_cpu_choice_and_says_what_the_engine_does_beside_the_holder(
    make_session, view, engines
):
    scans = HostScans([JAX_HOLDER])
    session = make_session(host_check_provider=scans)
    session.host_checked(session.inspect_host())
    session.launch_by_name("steps")
    view.questions[-1][3](True)
    session.cancel_latest()
    engine_says(session, view, engines[0], JobFinished(session.lane.runs[0].run_id, "cancelled", None))
    assert session.engine_settings.tpu == "none"

    assert session.reinitialize_runtime() is None
    assert len(engines) == 2 and session.engine_settings.tpu is None
    assert view.titles()[-1] == "Re-initialising"
    assert "runs TensorFlow on the CPU" in view.notices[-1][2]
