"""The writer's side of a profile (``ProfileResponder``) with a fake framework profiler: no TensorFlow here.

A request is armed by the poller, the next step starts the profiler, N steps
later it stops and the capture lands where XProf looks; the answer goes from
capturing to done, or failed with the reason. The step path makes no
file-system call; another worker's request is left alone; the run's end
answers what is pending. A bucket run's capture is uploaded.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
import time
import types
import uuid
from pathlib import Path

import pytest

from tpudash.profiles.capture import (
    REASON_PROFILER_BUSY,
    REASON_RUN_ENDED,
    ProfileResponder,
)
from tpudash.profiles.frameworks import TensorFlowProfiler
from tpudash.profiles.requests import (
    CAPTURES_FOLDER,
    REQUESTS_FOLDER,
    ProfileAnswer,
    read_answer,
    request_profile,
    wait_for_answer,
    write_answer,
)
from tpudash.runs.backends import BucketRoot, LocalRunFiles

RUN_ID = "20261128-070000-fit-abcdef"
CAPTURES_MADE = itertools.count(1)


class AlreadyExistsError(Exception):
    """What TensorFlow raises (with no text) when a profiler is already running in the process."""


class FakeProfiler(TensorFlowProfiler):
    """TensorFlow's profiler as the responder sees it, writing a capture as the real one lays it out."""

    def __init__(self, start_error: Exception | None = None, stop_error: Exception | None = None) -> None:
        super().__init__()
        self.start_error, self.stop_error = start_error, stop_error
        self.logdir: str | None = None
        self.started_steps: list[int] = []
        self.captures = 0
        self.marked: list[int] = []

    def start(self, logdir: str) -> None:
        if self.start_error is not None:
            raise self.start_error
        self.logdir = logdir

    def stop(self) -> None:
        if self.stop_error is not None:
            raise self.stop_error
        assert self.logdir is not None, "stopped without a start"
        self.captures += 1
        folder = Path(self.logdir, "plugins", "profile", f"2026_11_28_07_{next(CAPTURES_MADE):04d}")  # a new one each
        folder.mkdir(parents=True)
        (folder / "vm.xplane.pb").write_bytes(b"xplane %d" % self.captures)
        (folder / "vm.trace.json.gz").write_bytes(b"trace")
        self.logdir = None

    def marker(self, step: int) -> contextlib.AbstractContextManager:
        self.marked.append(step)
        return contextlib.nullcontext()

    def input_marker(self) -> contextlib.AbstractContextManager:
        self.inputs_marked = getattr(self, "inputs_marked", 0) + 1
        return contextlib.nullcontext()


class CountingFiles:
    """A run's files that count every call: the step path must make none."""

    def __init__(self, files) -> None:
        self._files = files
        self.calls = 0

    def __getattr__(self, name: str):
        attribute = getattr(self._files, name)
        if not callable(attribute):
            return attribute

        def counted(*args, **kwargs):
            self.calls += 1
            return attribute(*args, **kwargs)

        return counted


@pytest.fixture
def files(tmp_path):
    return LocalRunFiles(tmp_path / RUN_ID)


def responder_for(files, profiler=None, **options) -> ProfileResponder:
    lines: list[tuple[str, str]] = []
    options.setdefault("log", lambda level, text: lines.append((level, text)))
    responder = ProfileResponder(
        files, framework="tensorflow", host="vm", profiler=profiler or FakeProfiler(), **options
    )
    responder.lines = lines  # type: ignore[attr-defined]
    return responder


def train(responder: ProfileResponder, steps: range) -> None:
    for step in steps:
        responder.step_begin(step)
        with responder.marker(step):
            pass
        responder.step_end(step)


def test_a_request_is_captured_over_the_next_steps_and_answered_done(files):
    responder = responder_for(files)
    request = request_profile(files, steps=3)
    train(responder, range(1, 5))  # nothing armed yet: steps run unprofiled
    responder.poll_now()  # the poller's look: the request is armed for the next step
    train(responder, range(5, 12))
    responder.poll_now()  # the poller writes the answers the steps handed it
    assert [answer.state for answer in responder.answers] == ["capturing", "done"]
    answer = read_answer(files, request.id)
    assert answer is not None and answer.state == "done" and answer.reason is None
    assert (answer.first_step, answer.last_step, answer.worker, answer.host) == (5, 7, 0, "vm")
    assert answer.capture_seconds is not None and answer.capture_seconds >= 0
    capture = files.local_dir / "profile" / "plugins" / "profile" / answer.capture
    assert (capture / "vm.xplane.pb").read_bytes() == b"xplane 1"
    assert responder.profiler.captures == 1
    assert list(range(1, 12)) == responder.profiler.marked  # every step marked, profiled or not
    assert any("profile of steps 5–7 captured" in text for _, text in responder.lines)
    responder.close()
    assert read_answer(files, request.id).state == "done"  # the end changes nothing answered


def test_the_poller_thread_answers_a_request_while_steps_run(files):
    responder = responder_for(files, poll_seconds=0.01).start()
    request = request_profile(files, steps=2)
    stop = threading.Event()
    done = threading.Event()

    def training() -> None:
        step = 0
        while not stop.is_set():
            step += 1
            train(responder, range(step, step + 1))
            if responder.answers and responder.answers[-1].state == "done":
                done.set()
            done.wait(0.001)  # a step takes a moment; this is the loop's pace, not a synchronisation

    thread = threading.Thread(target=training)
    thread.start()
    try:
        answer = wait_for_answer(files, request.id, timeout=30, poll=0.01)
    finally:
        stop.set()
        thread.join()
        responder.close()
    assert answer is not None and answer.state == "done"
    assert answer.last_step == answer.first_step + 1


def test_the_step_path_makes_no_file_system_call(files):
    counting = CountingFiles(files)
    responder = responder_for(counting)
    train(responder, range(1, 1001))  # nothing asked: a thousand steps
    assert counting.calls == 0
    request_profile(files, steps=5)
    responder.poll_now()
    before = counting.calls
    train(responder, range(1001, 2001))  # a thousand more, five of them profiled
    assert counting.calls == before  # answers and the capture's placing are the poller's
    responder.poll_now()
    assert [answer.state for answer in responder.answers] == ["capturing", "done"]
    before = counting.calls
    responder.poll_now()  # nothing new: one listing of the requests, no request read again
    assert counting.calls == before + 1


def test_a_profiler_already_running_is_a_failed_answer_and_training_goes_on(files):
    responder = responder_for(files, FakeProfiler(start_error=AlreadyExistsError()))
    request = request_profile(files)
    responder.poll_now()
    train(responder, range(1, 10))  # no exception reaches the loop
    responder.poll_now()
    answer = read_answer(files, request.id)
    assert answer.state == "failed" and answer.reason == REASON_PROFILER_BUSY
    assert ("warning", f"profile {request.id} failed: {REASON_PROFILER_BUSY}") in responder.lines


@pytest.mark.parametrize("when", ["start", "stop"])
def test_a_framework_that_cannot_profile_is_a_failed_answer_with_its_error(files, when):
    error = RuntimeError("no profiler in this build")
    profiler = FakeProfiler(**{f"{when}_error": error})
    responder = responder_for(files, profiler)
    request = request_profile(files, steps=2)
    responder.poll_now()
    train(responder, range(1, 10))
    responder.poll_now()
    answer = read_answer(files, request.id)
    assert answer.state == "failed"
    assert answer.reason == "TensorFlow cannot profile here: RuntimeError: no profiler in this build"


def test_a_marker_that_fails_never_stops_a_step(files):
    class BrokenMarker(FakeProfiler):
        def marker(self, step):
            raise ImportError("no tensorflow")

    responder = responder_for(files, BrokenMarker())
    with responder.marker(1):
        ran = True
    assert ran


def test_the_input_marker_is_the_frameworks_and_one_that_fails_never_stops_a_step(files):
    profiler = FakeProfiler()
    with responder_for(files, profiler).input_marker():
        pass
    assert profiler.inputs_marked == 1

    class BrokenInputMarker(FakeProfiler):
        def input_marker(self):
            raise ImportError("no jax")

    with responder_for(files, BrokenInputMarker()).input_marker():
        ran = True
    assert ran


def test_the_input_marker_carries_the_name_xprof_counts_as_waiting_for_input():
    """XProf's ClassifyCpuEvent: a host event in a step is input only as a tf.data stage or IteratorGetNext."""
    from tpudash.profiles.frameworks import INPUT_MARKER_NAME, JaxProfiler

    made = []

    class Annotation:
        def __init__(self, name):
            made.append(name)

        def __enter__(self):
            return self

        def __exit__(self, *raised):
            return False

    fake_jax = types.SimpleNamespace(profiler=types.SimpleNamespace(TraceAnnotation=Annotation))
    profiler = JaxProfiler()
    profiler._framework = lambda: fake_jax  # type: ignore[method-assign]
    with profiler.input_marker():
        pass
    assert made == [INPUT_MARKER_NAME] == ["IteratorGetNext"]


def test_the_run_ending_before_the_profile_started_answers_pending_requests(files):
    responder = responder_for(files, poll_seconds=0.01).start()
    armed = request_profile(files)
    wait_until(lambda: responder.armed is not None)
    unread = request_profile(files)  # written after the last look: answered by the end all the same
    responder.close()
    for request in (armed, unread):
        answer = read_answer(files, request.id)
        assert answer is not None and answer.state == "failed" and answer.reason == REASON_RUN_ENDED


def test_the_run_ending_during_the_profile_keeps_the_steps_captured(files):
    responder = responder_for(files)
    request = request_profile(files, steps=10)
    responder.poll_now()
    train(responder, range(1, 4))
    responder.close()
    answer = read_answer(files, request.id)
    assert answer.state == "done" and (answer.first_step, answer.last_step) == (1, 3)
    assert answer.reason == "the run ended during the profile (steps 1–3 captured)"
    assert (files.local_dir / "profile/plugins/profile" / answer.capture / "vm.xplane.pb").is_file()


def test_a_request_for_another_worker_is_left_alone(files):
    second = responder_for(files, worker=1)
    chief = responder_for(files, worker=0)
    for_the_chief = request_profile(files, worker=None)
    for_the_third = request_profile(files, worker=2)
    second.poll_now()
    assert second.armed is None
    for_the_second = request_profile(files, worker=1)
    second.poll_now()
    chief.poll_now()
    assert second.armed == for_the_second.id
    assert chief.armed == for_the_chief.id
    train(second, range(1, 10))
    train(chief, range(1, 10))
    second.poll_now()
    chief.poll_now()
    assert read_answer(files, for_the_second.id).worker == 1
    assert read_answer(files, for_the_chief.id).worker == 0
    assert read_answer(files, for_the_third.id) is None


def test_answered_and_older_requests_are_ignored(files):
    answered = request_profile(files)
    write_answer(files, ProfileAnswer(answered.id, "failed", REASON_RUN_ENDED, None, None, None, "vm", 0,
                                      "tensorflow", time.time(), None))  # fmt: skip
    old = request_profile(files)
    payload = json.loads(files.read(f"{REQUESTS_FOLDER}/{old.id}.json", 4096))
    payload["requested_at"] = time.time() - 3600  # asked of an earlier writer of this run
    files.write(f"{REQUESTS_FOLDER}/{old.id}.json", json.dumps(payload).encode())
    responder = responder_for(files)
    responder.poll_now()
    assert responder.armed is None


def test_requests_are_answered_one_after_another_never_in_one_capture_folder(files):
    class NamedBySecond(FakeProfiler):
        """As TensorFlow and JAX name a capture: by the second it ends in (two in one second would share it)."""

        def stop(self) -> None:
            folder = Path(self.logdir, "plugins", "profile", time.strftime("%Y_%m_%d_%H_%M_%S"))
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "vm.xplane.pb").write_bytes(b"x" * (10 + len(self.marked)))

    responder = responder_for(files, NamedBySecond())
    first, second = request_profile(files, steps=2), request_profile(files, steps=3)
    deadline = time.monotonic() + 30
    step = 0
    while read_answer(files, second.id) is None or read_answer(files, second.id).state != "done":
        assert time.monotonic() < deadline, responder.answers
        step += 1
        responder.poll_now()  # the second waits for the next second of the clock: the loop goes on until then
        train(responder, range(step, step + 1))
    one, two = read_answer(files, first.id), read_answer(files, second.id)
    assert one.state == "done" and one.capture < two.capture  # answered in the order asked, in folders of their own
    assert two.first_step > one.last_step and two.last_step - two.first_step == 2


def test_a_scheduled_window_is_profiled_without_a_request(files):
    responder = responder_for(files)
    responder.schedule(4, 6)
    train(responder, range(1, 10))
    responder.poll_now()
    (answer,) = [answer for answer in responder.answers if answer.state == "done"]
    assert (answer.first_step, answer.last_step) == (4, 6)
    assert (files.local_dir / "profile/plugins/profile" / answer.capture / "vm.xplane.pb").is_file()


def test_a_bucket_run_s_capture_is_uploaded_where_xprof_looks(tmp_path):
    files = BucketRoot(f"memory://profiles-{uuid.uuid4().hex[:8]}/runs").files(RUN_ID)
    local_root = tmp_path / "local-copy"
    responder = responder_for(files, local_root=local_root, poll_seconds=0.01).start()
    request = request_profile(files, steps=2)
    wait_until(lambda: responder.armed is not None)
    train(responder, range(1, 4))
    answer = wait_for_answer(files, request.id, timeout=30, poll=0.01)
    responder.close()
    assert answer is not None and answer.state == "done"
    capture = f"{CAPTURES_FOLDER}/{answer.capture}"
    assert files.read(f"{capture}/vm.xplane.pb", 1 << 20) == b"xplane 1"
    assert files.read(f"{capture}/vm.trace.json.gz", 1 << 20) == b"trace"
    # Uploaded, then gone locally: what stays there is what the run's finish still has to upload.
    assert not any(path.is_file() for path in local_root.rglob("*"))


def test_a_bucket_upload_that_fails_keeps_the_capture_locally_and_says_where(tmp_path):
    files = BucketRoot(f"memory://profiles-{uuid.uuid4().hex[:8]}/runs").files(RUN_ID)

    class Refusing:
        where = files.where
        local_dir = None

        def __getattr__(self, name):
            return getattr(files, name)

        def write(self, name, data):
            if name.startswith(CAPTURES_FOLDER):
                raise OSError("the store is away")
            files.write(name, data)

    responder = responder_for(Refusing(), local_root=tmp_path)
    request = request_profile(files, steps=1)
    responder.poll_now()
    train(responder, range(1, 3))
    responder.poll_now()
    answer = read_answer(files, request.id)
    assert answer.state == "failed" and "the store is away" in answer.reason
    assert list(tmp_path.rglob("vm.xplane.pb")) and str(tmp_path) in answer.reason


def wait_until(condition, timeout: float = 30.0) -> None:
    """Until ``condition()`` holds, checking every few milliseconds (bounded): the poller works on its own thread."""
    deadline = time.monotonic() + timeout
    event = threading.Event()
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        event.wait(0.005)


def test_each_worker_of_a_recorded_cluster_run_answers_its_own_requests(tmp_path):
    from tpudash.recording import RecordedRun
    from tpudash.runs.workers import WorkerIdentity

    runtime = {"backend": "tensorflow", "kind": "CPU", "strategy": "MultiWorkerMirroredStrategy", "num_replicas": 2}
    workers = [
        RecordedRun("cluster", runs_dir=tmp_path, runtime=runtime, run_id="cluster-run",
                    worker=WorkerIdentity(index=index, count=2, task="worker", host=f"w{index}"))
        for index in (0, 1)
    ]  # fmt: skip
    for run in workers:
        run.profiler.profiler = FakeProfiler()  # no TensorFlow here: the fake writes the capture
    files = LocalRunFiles(tmp_path / "cluster-run")
    of_the_chief, of_the_second = request_profile(files, steps=1), request_profile(files, steps=1, worker=1)
    for run in workers:
        run.profiler.poll_now()
        for step in range(1, 4):
            with run.step(step):
                pass
        run.profiler.poll_now()
        run.finish()
    assert [run.profiler.worker for run in workers] == [0, 1]
    assert read_answer(files, of_the_chief.id).worker == 0 and read_answer(files, of_the_chief.id).state == "done"
    assert read_answer(files, of_the_second.id).worker == 1 and read_answer(files, of_the_second.id).state == "done"


def test_a_recorded_run_without_tensorflow_or_jax_has_no_profiler_and_its_steps_cost_nothing(tmp_path):
    from tpudash.recording import RecordedRun

    with RecordedRun("numpy-loop", runs_dir=tmp_path, runtime={"backend": "unknown"}) as run:
        assert run.profiler is None
        with run.step(1):
            run.progress(1, 1, "step")


def test_two_workers_on_one_host_writing_the_same_capture_folder_both_find_their_capture(files):
    class SameSecond(FakeProfiler):
        """Both workers' profilers name the capture by the same second, and the file by the same host."""

        def stop(self) -> None:
            folder = Path(self.logdir, "plugins", "profile", "2026_11_28_07_05_54")
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "vm.xplane.pb").write_bytes(b"x" * (10 + len(self.marked)))  # rewritten, another size

    chief, second = (responder_for(files, SameSecond(), worker=index) for index in (0, 1))
    asked = [request_profile(files, steps=1, worker=index) for index in (0, 1)]
    chief.poll_now()
    second.poll_now()
    train(chief, range(1, 3))
    chief.poll_now()
    train(second, range(1, 4))
    second.poll_now()
    answers = [read_answer(files, request.id) for request in asked]
    assert [(answer.state, answer.capture) for answer in answers] == [("done", "2026_11_28_07_05_54")] * 2


def test_a_store_that_cannot_be_listed_is_said_once_and_the_requests_are_answered_when_it_is_back(files):
    class Flaky:
        """The run's files, whose listing fails while ``away`` is set (a store that does not answer)."""

        away = True
        where, local_dir = files.where, files.local_dir

        def __getattr__(self, name):
            return getattr(files, name)

        def list(self, folder):
            if self.away:
                raise OSError("the store does not answer")
            return files.list(folder)

    flaky = Flaky()
    responder = responder_for(flaky)
    request = request_profile(files, steps=1)
    for _ in range(5):
        responder._poll_quietly()  # what the poller does once a second
    assert [text for _, text in responder.lines if "cannot be read" in text] == [
        "profile requests cannot be read (OSError: the store does not answer); retrying"
    ]
    flaky.away = False
    responder._poll_quietly()
    assert responder.armed == request.id and ("info", "profile requests can be read again") in responder.lines
