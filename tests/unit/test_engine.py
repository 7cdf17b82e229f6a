"""The engine's control pipe: hello, the runtime, runs reported, cancel, refusals, release, and its encoding.

``EngineThread`` runs the engine's real loop over real pipes on a thread, so
these tests exercise the protocol without a TensorFlow import; the process
itself (a kill -9, an abort) is tested in tests/functional/test_app_engine.py.
"""

from __future__ import annotations

import os
import queue
import threading
from pathlib import Path
from typing import TypeVar

import pytest

from jobs.base import JobSpec, Param
from jobs.events import Metric
from tpudash.accel.description import RuntimeDescription
from tpudash.childproc import decode_line, encode_line
from tpudash.config import Settings, settings_environment
from tpudash.engine.handle import EngineExit, EngineHandle, EngineProcess
from tpudash.engine.inthread import EngineThread
from tpudash.engine.protocol import (
    COMMANDS,
    PROTOCOL_VERSION,
    REPLIES,
    Cancel,
    Describe,
    Hello,
    JobFinished,
    JobStarted,
    Launch,
    LaunchRefused,
    ProtocolError,
    Release,
    RuntimeFailed,
    RuntimeReady,
    decode,
    encode,
)
from tpudash.engine.server import EngineServer, engine_job_specs, serve
from tpudash.runs.store import RunStore

WAIT = 30.0
T = TypeVar("T")


class FakeRuntime:
    description = RuntimeDescription(kind="CPU", strategy="MirroredStrategy", num_replicas=2, devices=[])

    def summary(self):
        return {"kind": "CPU", "num_replicas": 2}


def path_job(ctx, params):
    ctx.emit(Metric("x0", params["start"][0], 0))
    return {"start": list(params["start"]), "steps": params["steps"]}


PATH = JobSpec(
    "path", "Path", "echoes its params", (Param("start", "floats", (1.0, 4.0)), Param("steps", "int", 3)), run=path_job
)
entered = threading.Event()


def waiting_job(ctx, params):
    entered.set()
    while not ctx.cancel_event.wait(0.01):
        pass
    ctx.raise_if_cancelled()


WAITS = JobSpec("waits", "Waits", "runs until cancelled", (), run=waiting_job)


class Messages:
    def __init__(self):
        self.queue: queue.Queue = queue.Queue()

    def __call__(self, message):
        self.queue.put(message)

    def next(self, kind: type[T]) -> T:
        """The next message of ``kind`` (earlier ones of other kinds are skipped)."""
        while True:
            message = self.queue.get(timeout=WAIT)
            if isinstance(message, kind):
                return message


@pytest.fixture
def messages():
    return Messages()


@pytest.fixture
def engine(messages, settings):
    handle = EngineThread(messages, settings, {"path": PATH, "waits": WAITS}, FakeRuntime)
    yield handle
    handle.release()


def test_the_engine_says_hello_then_describes_its_runtime(engine, messages):
    assert messages.next(Hello).protocol == PROTOCOL_VERSION
    assert messages.next(RuntimeReady).description["num_replicas"] == 2
    engine.send(Describe())
    assert messages.next(RuntimeReady).description["kind"] == "CPU"


def test_a_launch_runs_with_the_params_sent_as_text_and_is_reported_started_then_finished(engine, messages, settings):
    engine.send(Launch("20261123-000000-path-abcdef", "path", {"start": "0.5,2", "steps": "7"}))
    started = messages.next(JobStarted)
    assert started.run_id == "20261123-000000-path-abcdef"
    assert started.run_dir == str(Path(settings.runs_dir) / "20261123-000000-path-abcdef")
    assert messages.next(JobFinished) == JobFinished("20261123-000000-path-abcdef", "done", None)
    data = RunStore(Path(settings.runs_dir)).load("20261123-000000-path-abcdef")
    assert data.info.status == "done" and data.info.summary == {"start": [0.5, 2.0], "steps": 7}


def test_cancel_reaches_the_running_job_and_it_is_recorded_cancelled(engine, messages, settings):
    entered.clear()
    engine.send(Launch("20261123-000000-waits-abcdef", "waits", {}))
    messages.next(JobStarted)
    assert entered.wait(WAIT)
    engine.send(Cancel("20261123-000000-waits-abcdef"))
    assert messages.next(JobFinished).status == "cancelled"
    assert RunStore(Path(settings.runs_dir)).load("20261123-000000-waits-abcdef").info.status == "cancelled"


def test_a_job_the_engine_does_not_have_or_bad_params_are_refused_with_the_reason(engine, messages):
    engine.send(Launch("r1", "no-such-job", {}))
    assert "no-such-job" in messages.next(LaunchRefused).error
    engine.send(Launch("r2", "path", {"steps": "many"}))
    refused = messages.next(LaunchRefused)
    assert refused.run_id == "r2" and "steps" in refused.error


def test_release_ends_the_engine_and_its_exit_counts_as_requested(engine, messages):
    messages.next(RuntimeReady)
    engine.release()
    exited = messages.next(EngineExit)
    assert exited.requested and not engine.send(Describe())


def test_the_engine_adds_only_the_jobs_its_caller_hands_it():
    from tests.engine_jobs import SPECS

    specs = engine_job_specs(SPECS)
    assert "test-abort" in specs and "matmul" in specs
    assert "test-abort" not in engine_job_specs()


def test_an_installed_engine_never_imports_a_module_named_in_its_environment(messages, settings, tmp_path):
    # The old test hook: TPUDASH_ENGINE_EXTRA_JOBS=<module> imported any module at the engine's start.
    (tmp_path / "planted_jobs.py").write_text(
        f"open({str(tmp_path / 'imported')!r}, 'w').close()\nraise SystemExit('planted module imported')\n"
    )
    environment = dict(os.environ)
    environment["TPUDASH_ENGINE_EXTRA_JOBS"] = "planted_jobs"
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), environment.get("PYTHONPATH")]))
    engine = EngineProcess(messages, settings, tmp_path / "engine.log", environ=environment)
    try:
        assert messages.next(Hello).pid == engine.pid
        engine.send(Launch("r1", "test-abort", {}))
        assert "'test-abort' is not installed" in messages.next(LaunchRefused).error
    finally:
        engine.release()
    assert messages.next(EngineExit).returncode == 0
    assert not (tmp_path / "imported").exists()


def test_the_engine_loads_the_dashboards_settings_from_its_environment(tmp_path):
    settings = Settings(
        tpu="none",
        cpu_devices=4,
        data_dir=tmp_path / "data",
        runs_dir=tmp_path / "runs",
        tpu_timeout=30.0,
        release_after=600.0,
        cancel_grace=1.5,
        engine_nice=5,
    )
    environment = settings_environment(settings, {"TPUDASH_TPU": "v4-8", "PATH": "/bin"})
    assert Settings.load(environ=environment) == settings
    automatic = settings_environment(Settings(runs_dir=tmp_path), {"TPUDASH_TPU": "v4-8"})
    assert "TPUDASH_TPU" not in automatic  # None means detect, in the engine too


# -- the pipe itself: the messages' encoding, ids, lines that are not messages ------------------------


PRIORITY_PROBE = """
import os, sys
if sys.argv[2] == "no-sched-idle":
    del os.SCHED_IDLE  # as on macOS
from tpudash.engine.server import lower_priority
setting = sys.argv[1]
lower_priority(setting if setting == "idle" else int(setting))
import threading
seen = []
thread = threading.Thread(target=lambda: seen.append((os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0))))
thread.start(); thread.join()
print(os.sched_getscheduler(0) == os.SCHED_IDLE if hasattr(os, "SCHED_IDLE") else None, os.getpriority(os.PRIO_PROCESS, 0), seen[0] == (os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0)))
"""


@pytest.mark.parametrize(
    ("setting", "platform", "idle_policy", "nice"),
    [
        ("idle", "linux", "True", 0),
        ("idle", "no-sched-idle", "None", 19),
        ("5", "linux", "False", 5),
        ("0", "linux", "False", 0),
    ],
)
def test_the_engine_gives_way_on_the_cpu_and_its_threads_inherit_it(setting, platform, idle_policy, nice):
    import subprocess
    import sys

    base = os.getpriority(os.PRIO_PROCESS, 0)
    shown = subprocess.run(
        [sys.executable, "-c", PRIORITY_PROBE, setting, platform], capture_output=True, text=True, check=True
    ).stdout.split()
    assert shown == [idle_policy, str(min(19, base + nice)), "True"]


def test_every_message_crosses_the_pipe_as_it_was_sent():
    for message, kinds in (
        (Launch("r1", "path", {"steps": "7"}), COMMANDS),
        (Cancel(None), COMMANDS),
        (Cancel("r1"), COMMANDS),
        (Describe(), COMMANDS),
        (Release(), COMMANDS),
        (Hello(pid=12, protocol=PROTOCOL_VERSION), REPLIES),
        (RuntimeReady({"kind": "CPU", "devices": [{"name": "/device:CPU:0"}]}), REPLIES),
        (RuntimeFailed("TensorFlowMissing: no TensorFlow", "no TensorFlow", True), REPLIES),
        (JobStarted("r1", "/runs/r1"), REPLIES),
        (JobFinished("r1", "failed", "boom"), REPLIES),
        (LaunchRefused("r1", "KeyError: 'path'"), REPLIES),
    ):
        assert decode(decode_line(encode_line(encode(message))), kinds) == message


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        (
            {"type": "launch", "run_id": "r1", "job": 3, "params": {}},
            "launch: field 'job' should be a string, got int 3",
        ),
        ({"type": "launch", "run_id": "r1", "job": "path"}, "launch: field 'params' is missing"),
        (
            {"type": "launch", "run_id": "r1", "job": "path", "params": {"steps": 7}},
            "launch: field 'params' should be an object of strings, got dict {'steps': 7}",
        ),
        ({"type": "cancel", "run_id": 5}, "cancel: field 'run_id' should be a string or null, got int 5"),
        ({"type": "launch!", "run_id": "r1"}, "unknown message type 'launch!'"),
        ({"run_id": "r1"}, "a message without a 'type'"),
    ],
    ids=["wrong-type", "missing", "params-not-text", "optional", "unknown", "no-type"],
)
def test_a_command_that_is_not_what_the_protocol_says_is_rejected_naming_the_field(payload, error):
    with pytest.raises(ProtocolError) as rejected:
        decode(payload, COMMANDS)
    assert str(rejected.value) == error


def test_a_boolean_is_no_protocol_version_and_a_command_is_no_reply():
    with pytest.raises(ProtocolError, match="hello: field 'protocol' should be an integer, got bool True"):
        decode({"type": "hello", "pid": 1, "protocol": True}, REPLIES)
    with pytest.raises(ProtocolError, match="unknown message type 'launch'"):
        decode(encode(Launch("r1", "path", {})), REPLIES)


class PipeEnd:
    """The test's end of the engine's pipe: it writes command lines and reads the reply lines."""

    def __init__(self):
        self.commands: queue.Queue = queue.Queue()
        self.replies: queue.Queue = queue.Queue()

    def __iter__(self):
        return iter(self.commands.get, None)

    def write(self, text: str) -> None:
        for line in text.splitlines():
            self.replies.put(decode_line(line))

    def flush(self) -> None:
        pass

    def reply(self, kind: str) -> dict:
        """The next reply line of ``kind`` (earlier ones of other kinds are skipped)."""
        while True:
            payload = self.replies.get(timeout=WAIT)
            if payload["type"] == kind:
                return payload


def test_replies_echo_the_id_of_the_command_they_answer_and_lines_that_are_no_command_are_skipped(settings):
    pipe = PipeEnd()
    engine = threading.Thread(
        target=serve,
        args=(pipe, pipe, lambda send: EngineServer(send, settings, {"path": PATH}, FakeRuntime, grace_seconds=0.0)),
        daemon=True,
    )
    engine.start()
    assert "id" not in pipe.reply("hello") and "id" not in pipe.reply("runtime")  # said unasked
    for line in ("a library printing\n", "[1, 2]\n", '{"type": "describe"\n'):
        pipe.commands.put(line)
    pipe.commands.put(encode_line({**encode(Describe()), "id": 5}))
    assert pipe.reply("runtime")["id"] == 5
    pipe.commands.put(encode_line({**encode(Launch("r6", "path", {"steps": "2"})), "id": 6}))
    assert pipe.reply("started")["id"] == 6 and pipe.reply("finished")["id"] == 6
    pipe.commands.put(encode_line({"type": "launch", "run_id": "r7", "job": 7, "params": {}, "id": 7}))
    refused = pipe.reply("refused")
    assert refused == {
        "type": "refused",
        "run_id": "r7",
        "id": 7,
        "error": "ProtocolError: launch: field 'job' should be a string, got int 7",
    }
    pipe.commands.put(encode_line(encode(Release())))
    engine.join(WAIT)
    assert not engine.is_alive()


def test_lines_from_the_engine_the_dashboard_cannot_read_are_kept_not_raised(messages):
    read_end, write_end = os.pipe()

    class PipeEngine(EngineHandle):
        def __init__(self, listener):
            super().__init__(listener)
            self._read_replies(
                os.fdopen(read_end, "r", encoding="utf-8"),
                lambda: listener(EngineExit(0, None, [], True)),
                "test-engine-reader",
            )

    handle = PipeEngine(messages)
    with os.fdopen(write_end, "w", encoding="utf-8") as engine_stdout:
        engine_stdout.write(
            "Loading libtpu (a library printing)\n"
            '{"type": "started", "run_id": "r1", "run_dir": 5}\n'
            '{"type": "from-a-newer-engine"}\n' + encode_line(encode(Hello(pid=7, protocol=PROTOCOL_VERSION)))
        )
    assert messages.next(Hello) == Hello(pid=7, protocol=PROTOCOL_VERSION)
    messages.next(EngineExit)
    assert handle.noise == [
        "Loading libtpu (a library printing)",
        """started: field 'run_dir' should be a string, got int 5: {"type": "started", "run_id": "r1", "run_dir": 5}""",
        """unknown message type 'from-a-newer-engine': {"type": "from-a-newer-engine"}""",
    ]


def test_python_m_tpudash_engine_says_hello_in_this_protocol_and_leaves_when_released(messages, settings, tmp_path):
    engine = EngineProcess(messages, settings, tmp_path / "engine.log")
    try:
        assert messages.next(Hello) == Hello(pid=engine.pid, protocol=PROTOCOL_VERSION)
    finally:
        engine.release()
    exited = messages.next(EngineExit)
    assert exited.requested and exited.returncode == 0 and not engine.alive
