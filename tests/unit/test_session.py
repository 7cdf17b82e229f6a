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
        self.tensorflow_missing = None
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
    view.tensorflow_missing = "no TensorFlow: pip install tensorflow-cpu"
    assert session.launch_by_name("steps") is None
    assert view.notices[-1] == ("error", "steps not launched: no TensorFlow", view.tensorflow_missing)
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
    engine_says(
        session, view, engines[0], RuntimeFailed(error="no module", message="install it", missing_tensorflow=True)
    )
    assert view.runtime_status == "no TensorFlow" and view.tensorflow_missing == "install it"
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
