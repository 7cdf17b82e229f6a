"""The dashboard's lane: queue, a warm engine, cancel with a grace period, crashes recorded, release.

A scripted engine stands in for the process: the test writes the run's
events to disk as the engine's runner would, and says what the engine says
(started, finished, exited). The clock is the test's, so the grace period
and the idle release are exact, with no waiting.
"""

from __future__ import annotations

import pytest

from jobs.base import JobSpec, Param
from jobs.events import Metric, Progress, RunFinished, RunStarted
from tpudash.childproc import decode_line, encode_line
from tpudash.engine.handle import EngineExit, EngineHandle
from tpudash.engine.lane import (
    ENGINE_CRASHED,
    ENGINE_INCOMPATIBLE,
    ENGINE_READY,
    ENGINE_RELEASED,
    ENGINE_RUNNING,
    ENGINE_STARTING,
    Lane,
    LaneObserver,
)
from tpudash.engine.protocol import (
    PROTOCOL_VERSION,
    REPLIES,
    Cancel,
    Command,
    Hello,
    JobFinished,
    JobStarted,
    Launch,
    Reply,
    RuntimeReady,
    decode,
    encode,
)
from tpudash.runs.store import RunStore

STEPS = JobSpec(
    "steps",
    "Steps",
    "counts",
    (Param("steps", "int", 3, minimum=1), Param("lr", "float", 0.1)),
    run=lambda ctx, params: {},
)
DESCRIPTION = {"kind": "CPU", "strategy": "MirroredStrategy", "num_replicas": 8, "devices": []}


class ScriptedEngine(EngineHandle):
    """Records what the lane sends; the test plays the engine's side."""

    def __init__(self, listener):
        super().__init__(listener)
        self.sent: list[Command] = []
        self.killed = False
        self.released = False

    def send(self, command: Command) -> bool:
        self.sent.append(command)
        return True

    def release(self) -> None:
        self.release_requested = True
        self.released = True

    def kill(self, reason: str) -> None:
        self.kill_reason = reason
        self.killed = True

    @property
    def alive(self) -> bool:
        return not (self.killed or self.released)

    def say(self, message: Reply) -> None:
        """What the engine says, the way the handle hears it: through the pipe's encoding."""
        self._listener(decode(decode_line(encode_line(encode(message))), REPLIES))

    def exit(self, returncode: int | None, signal_name: str | None = None, stderr_tail=()) -> None:
        requested = self.release_requested or self.kill_reason is not None
        self._listener(EngineExit(returncode, signal_name, list(stderr_tail), requested))


class Recorder(LaneObserver):
    def __init__(self):
        self.settled = []
        self.runtimes = []
        self.failures = []

    def lane_run_settled(self, live):
        self.settled.append((live.run_id, live.model.status))

    def lane_runtime(self, description):
        self.runtimes.append(description)

    def lane_runtime_failed(self, failure):
        self.failures.append(failure)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def engines():
    return []


@pytest.fixture
def observer():
    return Recorder()


@pytest.fixture
def make_lane(store, engines, observer, clock):
    def make(**options) -> Lane:
        def start(listener):
            engine = ScriptedEngine(listener)
            engines.append(engine)
            return engine

        return Lane(store, start, observer, clock=clock, **options)

    return make


def start_run(lane: Lane, engine: ScriptedEngine, store: RunStore, live, metrics=2):
    """Play the engine: the runtime answers, the run starts and reports ``metrics`` steps."""
    engine.say(RuntimeReady(DESCRIPTION))
    recorder = store.create(live.run_id, live.job, STEPS.as_text(live.params), DESCRIPTION)
    recorder.record(RunStarted(live.run_id, live.job, live.params, DESCRIPTION, 1.0))
    for step in range(metrics):
        recorder.record(Metric("loss", 1.0 / (step + 1), step))
        recorder.record(Progress(step + 1, 10, "step"))
    engine.say(JobStarted(live.run_id, str(store.root / live.run_id)))
    lane.poll()
    return recorder


def test_runs_go_to_one_warm_engine_one_at_a_time_with_their_params_as_text(make_lane, engines, store, observer):
    lane = make_lane()
    first = lane.launch(STEPS, {"steps": 5, "lr": 0.25})
    second = lane.launch(STEPS, {"steps": 7, "lr": 0.1})
    assert len(engines) == 1 and lane.engine_state == ENGINE_STARTING
    engine = engines[0]
    assert engine.sent == [Launch(first.run_id, "steps", {"steps": "5", "lr": "0.25"})]
    assert second.queue_position == 1 and first.queue_position == 0

    recorder = start_run(lane, engine, store, first)
    assert lane.engine_state == ENGINE_RUNNING and lane.engine_line() == "running steps"
    assert first.model.status == "running" and first.model.final_metrics == {"loss": 0.5}
    # A batch's metrics reach the model, but are no lane change: lists of runs are not redrawn for them.
    recorder.record(Metric("loss", 0.25, 3))
    assert lane.poll() is False and first.model.final_metrics == {"loss": 0.25}
    recorder.record(RunFinished("done", {"steps": 5}))
    engine.say(JobFinished(first.run_id, "done", None))
    lane.poll()
    assert observer.settled == [(first.run_id, "done")] and first.settled.is_set()
    # The same engine takes the next run: no second TensorFlow import.
    assert len(engines) == 1 and engine.sent[-1] == Launch(second.run_id, "steps", {"steps": "7", "lr": "0.1"})
    assert lane.engine_starts == 1


def test_cancel_a_queued_run_never_reaches_the_engine_and_leaves_no_record(make_lane, engines, store, observer):
    lane = make_lane()
    running = lane.launch(STEPS, {"steps": 5, "lr": 0.1})
    queued = lane.launch(STEPS, {"steps": 5, "lr": 0.1})
    lane.cancel(queued)
    assert queued.model.status == "cancelled" and queued.settled.is_set()
    assert engines[0].sent == [Launch(running.run_id, "steps", {"steps": "5", "lr": "0.1"})]
    assert not (store.root / queued.run_id).exists()


def test_a_job_that_ignores_cancel_has_its_engine_ended_after_the_grace_and_is_recorded_cancelled(
    make_lane, engines, store, clock
):
    lane = make_lane(cancel_grace=2.0)
    live = lane.launch(STEPS, {"steps": 5, "lr": 0.1})
    engine = engines[0]
    start_run(lane, engine, store, live, metrics=3)
    lane.cancel(live)
    assert engine.sent[-1] == Cancel(live.run_id) and live.cancelling
    clock.now += 1.9
    lane.poll()
    assert not engine.killed
    clock.now += 0.1
    lane.poll()
    assert engine.killed and "did not stop within 2 s of cancel" in engine.kill_reason
    engine.exit(-9, "SIGKILL")
    lane.poll()

    assert live.settled.is_set() and live.model.status == "cancelled"
    info = store.info(store.root / live.run_id)
    assert info.status == "cancelled" and "did not stop within 2 s" in info.error
    assert info.final_metrics == {"loss": 1.0 / 3}  # everything it reported is kept
    assert lane.engine_state == ENGINE_RELEASED and not lane.busy
    lane.launch(STEPS, {"steps": 1, "lr": 0.1})
    assert len(engines) == 2 and lane.engine_starts == 2


def test_an_engine_killed_by_a_signal_records_the_run_failed_with_the_signal_and_its_last_stderr(
    make_lane, engines, store, observer
):
    lane = make_lane()
    live = lane.launch(STEPS, {"steps": 5, "lr": 0.1})
    engine = engines[0]
    start_run(lane, engine, store, live)
    engine.exit(-6, "SIGABRT", ["F0000 check failed: tpu_driver.cc:42 device lost"])
    lane.poll()

    assert live.model.status == "failed"
    info = store.info(store.root / live.run_id)
    assert info.status == "failed"
    assert "the engine was killed by SIGABRT while running steps" in info.error
    assert "device lost" in info.error
    assert info.final_metrics == {"loss": 0.5}
    assert lane.engine_state == ENGINE_CRASHED and lane.engine_line() == "crashed (SIGABRT)"
    assert not lane.busy
    lane.launch(STEPS, {"steps": 1, "lr": 0.1})
    assert len(engines) == 2 and lane.engine_state == ENGINE_STARTING


def test_a_crashed_engines_run_names_its_real_last_error_lines_not_tensorflows_start_up_noise(
    make_lane, engines, store
):
    """Issue 38: the reason was mostly absl's, oneDNN's and CUDA's start-up lines; it filled the header."""
    from tests.crashing_engine import CRASH_STDERR

    lane = make_lane()
    live = lane.launch(STEPS, {"steps": 5, "lr": 0.1})
    engine = engines[0]
    start_run(lane, engine, store, live)
    stderr_lines = CRASH_STDERR.read_text(encoding="utf-8").splitlines()
    engine._listener(EngineExit.from_stderr(-11, "SIGSEGV", stderr_lines, requested=False))
    lane.poll()

    info = store.info(store.root / live.run_id)
    assert info.status == "failed"
    assert info.error.startswith(
        "the engine was killed by SIGSEGV while running steps; its last stderr lines: "
        "Fatal Python error: Segmentation fault | Current thread 0x00007f59c302eb80 (most recent call first): | "
    )
    assert info.error.endswith('File "<string>", line 6 in train_step |   File "<string>", line 7 in <module>')
    for noise in ("absl::InitializeLog", "oneDNN", "cuda drivers", "cuInit", "Extension modules"):
        assert noise not in info.error and noise not in live.model.error, noise


def test_an_engine_killed_with_only_start_up_noise_on_its_stderr_says_so(make_lane, engines, store):
    from tests.crashing_engine import CRASH_STDERR

    lane = make_lane()
    live = lane.launch(STEPS, {"steps": 5, "lr": 0.1})
    engine = engines[0]
    start_run(lane, engine, store, live)
    start_up = CRASH_STDERR.read_text(encoding="utf-8").splitlines()[:7]
    engine._listener(EngineExit.from_stderr(-9, "SIGKILL", start_up, requested=False))
    lane.poll()
    assert store.info(store.root / live.run_id).error == (
        "the engine was killed by SIGKILL while running steps; its stderr held only TensorFlow's start-up "
        "messages (the session log keeps them)"
    )


def test_an_engine_that_dies_before_the_run_began_still_leaves_a_failed_record(make_lane, engines, store):
    lane = make_lane()
    live = lane.launch(STEPS, {"steps": 5, "lr": 0.1})
    engines[0].exit(1, None, ["ImportError: libtpu.so: cannot open shared object file"])
    lane.poll()
    info = store.info(store.root / live.run_id)
    assert info.status == "failed" and info.job == "steps" and info.params == {"steps": "5", "lr": "0.1"}
    assert "exited with status 1" in info.error and "libtpu.so" in info.error
    assert live.model.status == "failed"


def test_a_run_the_engine_never_began_because_the_runtime_failed_is_recorded_failed(make_lane, engines, store):
    lane = make_lane()
    live = lane.launch(STEPS, {"steps": 5, "lr": 0.1})
    engines[0].say(JobFinished(live.run_id, "failed", "RuntimeError: the runtime could not be set up: no TPU"))
    lane.poll()
    info = store.info(store.root / live.run_id)
    assert info.status == "failed" and "no TPU" in info.error
    assert live.settled.is_set()


def test_release_is_refused_while_a_job_runs_and_frees_the_engine_when_idle(make_lane, engines, store):
    lane = make_lane()
    live = lane.launch(STEPS, {"steps": 5, "lr": 0.1})
    recorder = start_run(lane, engines[0], store, live)
    assert lane.release() == "steps is running; cancel it first" and not engines[0].released
    recorder.record(RunFinished("done", {}))
    engines[0].say(JobFinished(live.run_id, "done", None))
    lane.poll()
    assert lane.release() is None and engines[0].released
    assert lane.engine_state == ENGINE_RELEASED and lane.engine_line() == "released"
    engines[0].exit(0)
    lane.poll()
    assert lane.engine_state == ENGINE_RELEASED  # a released engine's exit is no crash


def test_an_idle_engine_is_released_after_release_after_seconds(make_lane, engines, clock):
    lane = make_lane(release_after=300)
    lane.ensure_engine()
    engines[0].say(RuntimeReady(DESCRIPTION))
    lane.poll()
    assert lane.engine_state == ENGINE_READY and lane.engine_line() == "ready on CPU"
    clock.now += 299
    lane.poll()
    assert not engines[0].released
    clock.now += 1
    lane.poll()
    assert engines[0].released and lane.engine_line() == "released (idle for 300 s)"


def test_the_devices_screen_starts_the_engine_once_but_not_again_after_a_release(make_lane, engines):
    lane = make_lane()
    lane.ensure_engine()
    lane.ensure_engine()
    assert len(engines) == 1
    lane.release()
    lane.ensure_engine()
    assert len(engines) == 1  # the user released it; only a launch or a re-initialise starts another
    assert lane.restart_engine() is None and len(engines) == 2


def test_quit_cancels_everything_and_is_stopped_once_the_running_run_is_recorded(make_lane, engines, store, clock):
    lane = make_lane(cancel_grace=2.0)
    running = lane.launch(STEPS, {"steps": 5, "lr": 0.1})
    waiting = lane.launch(STEPS, {"steps": 5, "lr": 0.1})
    recorder = start_run(lane, engines[0], store, running)
    lane.stop()
    assert waiting.model.status == "cancelled" and not lane.stopped
    recorder.record(RunFinished("cancelled", {}))
    engines[0].say(JobFinished(running.run_id, "cancelled", None))
    lane.poll()
    assert lane.stopped and running.model.status == "cancelled"
    lane.close()
    assert engines[0].released


def test_an_engine_of_this_protocol_is_used_and_one_of_another_is_ended_at_its_hello_saying_what_to_do(
    make_lane, engines, store, observer
):
    lane = make_lane()
    lane.ensure_engine()
    engines[0].say(Hello(pid=4242, protocol=PROTOCOL_VERSION))
    lane.poll()
    assert not engines[0].killed and observer.failures == []
    lane.release()

    running = lane.launch(STEPS, {"steps": 5, "lr": 0.1})
    waiting = lane.launch(STEPS, {"steps": 6, "lr": 0.1})
    engine = engines[1]
    engine.say(Hello(pid=4243, protocol=PROTOCOL_VERSION + 1))
    lane.poll()
    expected = f"engine speaks protocol {PROTOCOL_VERSION + 1}, dashboard {PROTOCOL_VERSION}: reinstall tpudash"
    assert engine.killed and engine.kill_reason == expected
    assert [failure.error for failure in observer.failures] == [expected]  # the Devices screen says it
    engine.exit(-9, "SIGKILL")
    lane.poll()

    assert lane.engine_state == ENGINE_INCOMPATIBLE and lane.engine_line() == f"incompatible ({expected})"
    assert (running.model.status, running.model.error) == ("failed", expected)
    assert store.info(store.root / running.run_id).error == expected
    # The runs behind it would meet the same engine: they fail with it, and no engine starts for them.
    assert (waiting.model.status, waiting.model.error) == ("failed", expected) and waiting.settled.is_set()
    assert len(engines) == 2 and not lane.busy
    lane.launch(STEPS, {"steps": 1, "lr": 0.1})  # after a reinstall, the next launch tries a new engine
    assert len(engines) == 3 and lane.engine_state == ENGINE_STARTING
