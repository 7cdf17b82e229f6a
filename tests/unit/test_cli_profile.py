"""``tpudash profile``: its flags, exit codes and sentences, ``--json``, ``--list`` and ``--capture``, with fakes.

The run's writer is played by a real ``ProfileResponder`` driven by a loop in a thread, or by a
writer that answers at once; XProf's converter (``tpudash.profiles.convert``) and the capture
listing (``tpudash.profiles.summary``) are fakes here: the real ones are tested with a real
capture in ``test_engine_profile.py``.
"""

from __future__ import annotations

import json
import sys
import threading
import types
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from jobs import get_job
from jobs.events import RunFinished
from tpudash.cli import main as cli
from tpudash.cli.exits import BadInput
from tpudash.cli.profilesteps import with_profile_steps
from tpudash.profiles import requests as profile_requests
from tpudash.profiles.requests import ProfileAnswer, write_answer
from tpudash.runs.layout import new_run_id
from tpudash.runs.store import RunStore

CAPTURE = "2026_11_28_07_05_54"
SUMMARY = {
    "version": 1,
    "capture": CAPTURE,
    "hosts": ["vm"],
    "framework": "tensorflow",
    "hardware": "CPU_ONLY",
    "steps": 5,
    "step_time_ms": {"avg": 41.6, "min": 39.4, "max": 43.8, "std": 1.9},
    "per_step": [],
    "breakdown": {
        "input": 90.3,
        "host_compute": 8.9,
        "device_compute": 0.0,
        "collectives": 0.0,
        "compile": 0.0,
        "other": 0.7,
        "idle": 0.1,
    },
    "input_percent": 90.3,
    "verdict": "input-bound",
    "input_conclusion": "Your program is HIGHLY input-bound because 90.3% of the step time is spent waiting for input.",
    "bottleneck": "",
    "recommendations": ["Enable tf.data prefetch.", "Cache the dataset."],
    "utilisation": {
        name: {"percent": None, "note": "not measured on CPU"}
        for name in ("duty_cycle", "mxu", "flop_rate_vs_roofline", "memory_bandwidth")
    },
    "top_ops": [{"name": "MatMul", "type": "MatMul", "self_percent": 31.2, "self_ms": 12.0}],
    "top_ops_source": "xprof framework_op_stats (host)",
    "input_stages": [],
    "notes": [],
    "tool": "xprof 2.24.2",
    "convert_seconds": 0.04,
}


@dataclass(frozen=True)
class FakeCaptureInfo:
    name: str
    hosts: list[str]
    has_summary: bool
    started_at: float | None


@dataclass
class FakeSummary:
    payload: dict

    def to_json(self) -> dict:
        return dict(self.payload)


class FakeProfileError(Exception):
    pass


@dataclass
class FakeXprof:
    """What the fake converter does and was asked."""

    available: bool = True
    fails_with: str | None = None
    converted: list[str] = field(default_factory=list)


@pytest.fixture
def xprof(monkeypatch) -> FakeXprof:
    """Fakes of ``tpudash.profiles.convert`` and ``summary``: captures are the folders under profile/plugins/profile."""
    state = FakeXprof()

    def captures(files) -> list[FakeCaptureInfo]:
        folder = files.local_dir / "profile" / "plugins" / "profile"
        names = sorted((path.name for path in folder.glob("*") if path.is_dir()), reverse=True)
        return [FakeCaptureInfo(name, ["vm"], name in state.converted, None) for name in names]

    def summarize_run_capture(files, capture, *, cache_root, timeout=120.0):
        if state.fails_with is not None:
            raise FakeProfileError(state.fails_with)
        state.converted.append(capture)
        return FakeSummary(dict(SUMMARY, capture=capture))

    convert = types.ModuleType("tpudash.profiles.convert")
    convert.PROFILE_EXTRA_INSTALL = 'pip install "tpudash[profile]"'  # type: ignore[attr-defined]
    convert.ProfileError = FakeProfileError  # type: ignore[attr-defined]
    convert.xprof_available = lambda: state.available  # type: ignore[attr-defined]
    convert.summarize_run_capture = summarize_run_capture  # type: ignore[attr-defined]
    convert.convert_capture = lambda capture_dir, *, timeout=120.0: FakeSummary(  # type: ignore[attr-defined]
        dict(SUMMARY, capture=Path(capture_dir).name)
    )
    summary = types.ModuleType("tpudash.profiles.summary")
    summary.list_captures = captures  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tpudash.profiles.convert", convert)
    monkeypatch.setitem(sys.modules, "tpudash.profiles.summary", summary)
    return state


@pytest.fixture
def live_run(isolated_runs_dir):
    """A run whose writer is live (its recorder holds the lock) for the test's length."""
    store = RunStore(isolated_runs_dir)
    run_id = new_run_id("fit")
    recorder = store.create(run_id, "fit", {}, {"kind": "CPU"})
    yield store, run_id
    recorder.close()


def ended_run(runs_dir: Path) -> tuple[RunStore, str]:
    store = RunStore(runs_dir)
    run_id = new_run_id("fit")
    recorder = store.create(run_id, "fit", {}, {"kind": "CPU"})
    recorder.record(RunFinished(status="done", summary={}))
    recorder.close()
    return store, run_id


def add_capture(store: RunStore, run_id: str, name: str = CAPTURE) -> None:
    store.files(run_id).write(f"profile/plugins/profile/{name}/vm.xplane.pb", b"xplane")


def answer_at_once(monkeypatch, store: RunStore, run_id: str, state: str, reason: str | None = None) -> None:
    """A writer that answers every request as it is written: ``state``, with a capture if done."""
    real = profile_requests.request_profile

    def request_and_answer(files, steps=5, worker=None):
        request = real(files, steps, worker)
        done = state == "done"
        if done:
            add_capture(store, run_id)
        write_answer(
            files,
            ProfileAnswer(
                id=request.id,
                state=state,
                reason=reason,
                capture=CAPTURE if done else None,
                first_step=7 if done else None,
                last_step=7 + steps - 1 if done else None,
                host="vm",
                worker=worker or 0,
                framework="tensorflow",
                answered_at=request.requested_at,
                capture_seconds=0.1 if done else None,
            ),
        )
        return request

    monkeypatch.setattr(profile_requests, "request_profile", request_and_answer)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--steps", "0"], "--steps: '0' is not allowed; allowed: a whole number of steps from 1 to 1000"),
        (["--steps", "1001"], "--steps: '1001' is not allowed; allowed: a whole number of steps from 1 to 1000"),
        (["--steps", "five"], "--steps: 'five' is not allowed"),
        (["--worker", "-1"], "--worker: '-1' is not allowed; allowed: a worker index from 0 (the chief)"),
        (["--timeout", "0"], "--timeout: '0' is not allowed; allowed: a number of seconds > 0"),
        (["--timeout", "nan"], "--timeout: 'nan' is not allowed"),
        (["--list", "--steps", "3"], "--steps: not with --list"),
        (["--duration", "2s"], "--duration: only with --attach HOST:PORT"),
        (["--capture", "../x"], "--capture: '../x' is not allowed; allowed: a plain name"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag_and_what_is_allowed(live_run, xprof, capsys, argv, said):
    _, run_id = live_run
    assert cli.main(["profile", run_id, *argv]) == 2
    assert said in capsys.readouterr().err
    assert xprof.converted == []


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--attach", "localhost"], "--attach: 'localhost' is not allowed; allowed: HOST:PORT of a profiler server"),
        (["--attach", "127.0.0.1:70000"], "--attach: '127.0.0.1:70000' is not allowed"),
        (["--attach", "127.0.0.1:9012", "--duration", "0s"], "--duration: '0s' is not allowed; allowed: a time from"),
        (["--attach", "127.0.0.1:9012", "--duration", "soon"], "--duration: 'soon' is not allowed"),
        (["--attach", "127.0.0.1:9012", "--steps", "3"], "--steps: not with --attach"),
        ([], "RUN: name the run to profile"),
    ],
)
def test_attach_and_a_missing_run_are_bad_input(isolated_runs_dir, xprof, capsys, argv, said):
    assert cli.main(["profile", *argv]) == 2
    assert said in capsys.readouterr().err


def test_a_run_that_does_not_exist_is_bad_input(isolated_runs_dir, xprof, capsys):
    isolated_runs_dir.mkdir(parents=True)
    assert cli.main(["profile", "20260101-000000-fit-abcdef"]) == 2
    assert "RUN: no run '20260101-000000-fit-abcdef'" in capsys.readouterr().err


def test_a_run_that_is_not_live_exits_1_naming_its_status(isolated_runs_dir, xprof, capsys):
    store, run_id = ended_run(isolated_runs_dir)
    assert cli.main(["profile", run_id[:20]]) == 1
    assert f"run {run_id} is not live (done): nothing is training to profile" in capsys.readouterr().err
    assert store.files(run_id).list("profile/requests") == []  # nothing asked of a writer that is gone


def test_without_xprof_the_install_line_is_said_and_nothing_is_asked(live_run, xprof, capsys):
    store, run_id = live_run
    xprof.available = False
    assert cli.main(["profile", run_id]) == 1
    assert 'reading a profile needs xprof: pip install "tpudash[profile]"' in capsys.readouterr().err
    assert store.files(run_id).list("profile/requests") == []


def test_the_writers_failed_answer_is_the_reason_given(live_run, xprof, monkeypatch, capsys):
    store, run_id = live_run
    busy = "a profiler is already running in this process (e.g. a TensorBoard callback's)"
    answer_at_once(monkeypatch, store, run_id, "failed", busy)
    assert cli.main(["profile", run_id]) == 1
    assert f"the writer of {run_id} could not profile: {busy}" in capsys.readouterr().err


def test_no_answer_in_time_is_a_sentence_with_what_to_do(live_run, xprof, capsys):
    store, run_id = live_run
    assert cli.main(["profile", run_id, "--timeout", "0.3", "--worker", "2"]) == 1
    err = capsys.readouterr().err
    assert f"no answer from worker 2 of {run_id} in 0.3 s" in err and "--timeout waits longer" in err
    [request] = profile_requests.read_requests(store.files(run_id))
    assert (request.steps, request.worker) == (5, 2)


def test_json_prints_the_summary_with_the_run_the_capture_and_where(live_run, xprof, monkeypatch, capsys):
    store, run_id = live_run
    answer_at_once(monkeypatch, store, run_id, "done")
    assert cli.main(["profile", run_id, "--steps", "3", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    for key in ("steps", "step_time_ms", "breakdown", "input_percent", "verdict", "top_ops", "recommendations"):
        assert key in printed
    assert "utilisation" in printed
    assert set(printed["step_time_ms"]) == {"avg", "min", "max", "std"}
    assert {"name", "type", "self_percent"} <= set(printed["top_ops"][0])
    assert printed["run_id"] == run_id and printed["capture"] == CAPTURE
    assert printed["profile_dir"] == str(Path(store.find(run_id)) / "profile")
    assert xprof.converted == [CAPTURE]


def test_the_summary_is_printed_readable_and_unwrapped_into_a_pipe(live_run, xprof, monkeypatch, capsys):
    store, run_id = live_run
    answer_at_once(monkeypatch, store, run_id, "done")
    assert cli.main(["profile", run_id]) == 0
    out = capsys.readouterr().out
    assert f"profile {CAPTURE} of {run_id}: 5 steps, tensorflow on CPU_ONLY (vm)" in out
    assert "step time: avg 41.6 ms, min 39.4 ms, max 43.8 ms, σ 1.9 ms" in out
    assert "verdict: input-bound (input 90.3 % of step time)" in out
    assert SUMMARY["input_conclusion"] in out  # one line, as long as it is: a pipe is not wrapped
    assert "duty cycle not measured on CPU" in out
    assert "- Cache the dataset." in out
    assert f"xprof --logdir {Path(store.find(run_id)) / 'profile'}" in out
    assert not any(line.endswith(" ") for line in out.splitlines())


def test_a_converter_failure_is_its_sentence_and_exit_1(live_run, xprof, monkeypatch, capsys):
    store, run_id = live_run
    answer_at_once(monkeypatch, store, run_id, "done")
    xprof.fails_with = "converting the capture took longer than 120 s"
    assert cli.main(["profile", run_id]) == 1
    assert "tpudash: converting the capture took longer than 120 s" in capsys.readouterr().err


def test_a_real_responder_answers_the_command_between_the_steps_of_a_loop(live_run, xprof, capsys):
    """The command and the writer's side together: a request, picked up by a loop's responder, captured, shown."""
    from contextlib import nullcontext

    from tpudash.profiles.capture import ProfileResponder

    store, run_id = live_run

    class FakeFrameworkProfiler:
        def start(self, logdir: str) -> None:
            self.logdir = logdir

        def stop(self) -> None:
            folder = Path(self.logdir) / "plugins" / "profile" / CAPTURE
            folder.mkdir(parents=True)
            (folder / "vm.xplane.pb").write_bytes(b"xplane")

        def marker(self, step: int):
            return nullcontext()

        def is_busy(self, error: BaseException) -> bool:
            return False

    responder = ProfileResponder(
        store.files(run_id), framework="tensorflow", profiler=FakeFrameworkProfiler(), poll_seconds=0.05
    ).start()
    stop = threading.Event()

    def training_loop() -> None:
        step = 0
        while not stop.wait(0.01):  # a step of 10 ms
            step += 1
            responder.step_begin(step)
            responder.step_end(step)

    loop = threading.Thread(target=training_loop, daemon=True)
    loop.start()
    try:
        assert cli.main(["profile", run_id, "--steps", "3", "--json", "--timeout", "30"]) == 0
    finally:
        stop.set()
        loop.join()
        responder.close()
    printed = json.loads(capsys.readouterr().out)
    assert printed["capture"] == CAPTURE
    [answer] = profile_requests.read_answers(store.files(run_id))
    assert answer.state == "done" and answer.last_step - answer.first_step == 2


def test_list_shows_an_ended_runs_captures_as_text_and_json(isolated_runs_dir, xprof, capsys):
    store, run_id = ended_run(isolated_runs_dir)
    add_capture(store, run_id, "2026_11_28_07_05_54")
    add_capture(store, run_id, "2026_11_28_08_00_00")
    assert cli.main(["profile", run_id, "--list"]) == 0
    out = capsys.readouterr().out
    assert out.index("2026_11_28_08_00_00") < out.index("2026_11_28_07_05_54")  # newest first
    assert cli.main(["profile", run_id, "--list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [capture["capture"] for capture in listed["captures"]] == ["2026_11_28_08_00_00", "2026_11_28_07_05_54"]
    assert listed["run_id"] == run_id


def test_capture_shows_one_capture_of_an_ended_run_converting_it(isolated_runs_dir, xprof, capsys):
    store, run_id = ended_run(isolated_runs_dir)
    add_capture(store, run_id)
    assert cli.main(["profile", run_id, "--capture", CAPTURE, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["capture"] == CAPTURE
    assert xprof.converted == [CAPTURE]
    assert cli.main(["profile", run_id, "--capture", "2026_01_01_00_00_00"]) == 2
    assert f"--capture: run {run_id} has no capture '2026_01_01_00_00_00'; its captures: {CAPTURE}" in (
        capsys.readouterr().err
    )


def test_run_profile_steps_sets_the_train_jobs_window_and_is_refused_elsewhere():
    train, matmul = get_job("train"), get_job("matmul")
    assert with_profile_steps(train, {"epochs": "1"}, "2-4") == {"epochs": "1", "profile_steps": "2-4"}
    with pytest.raises(BadInput, match="--profile-steps: job matmul has no training steps to profile; allowed with"):
        with_profile_steps(matmul, {}, "2-4")
    with pytest.raises(BadInput, match="--profile-steps: '4-2' is not a step range"):
        with_profile_steps(train, {}, "4-2")
    with pytest.raises(BadInput, match="disagree"):
        with_profile_steps(train, {"profile_steps": "1-2"}, "2-4")


def test_run_with_profile_steps_on_a_job_without_steps_exits_2_before_anything_runs(isolated_runs_dir, capsys):
    assert cli.main(["run", "matmul", "--profile-steps", "2-4"]) == 2
    assert "--profile-steps: job matmul has no training steps to profile" in capsys.readouterr().err
    assert not isolated_runs_dir.exists() or not any(isolated_runs_dir.iterdir())


def free_loopback_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_attach_to_a_port_where_no_profiler_listens_says_so(isolated_runs_dir, xprof, tmp_path, capsys):
    pytest.importorskip("xprof")  # the capturing child's client
    port = free_loopback_port()
    assert cli.main(["profile", "--attach", f"127.0.0.1:{port}", "--duration", "100ms", "--logdir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"no capture from the profiler server at 127.0.0.1:{port}: connection refused" in err


SERVER = """
import sys, tensorflow as tf
tf.profiler.experimental.server.start(int(sys.argv[1]))
print("listening", flush=True)
x = tf.random.normal((64, 64))
step = 0
while True:
    with tf.profiler.experimental.Trace("train", step_num=step, _r=1):
        tf.matmul(x, x)
    step += 1
"""


@pytest.mark.slow  # a TensorFlow process as the profiler server: its import alone takes seconds on 2 cores
def test_attach_captures_by_duration_from_a_real_profiler_server(isolated_runs_dir, xprof, tmp_path, capsys):
    import subprocess

    pytest.importorskip("xprof")
    port = free_loopback_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "listening"
        argv = ["profile", "--attach", f"127.0.0.1:{port}", "--duration", "500ms", "--logdir", str(tmp_path), "--json"]
        assert cli.main(argv) == 0
    finally:
        server.kill()
        server.wait()
    printed = json.loads(capsys.readouterr().out)
    [capture] = list((tmp_path / "plugins" / "profile").iterdir())
    assert printed["capture"] == capture.name and printed["profile_dir"] == str(tmp_path)
    assert [path.suffix for path in capture.iterdir()] == [".pb"]


def test_list_and_capture_through_the_real_listing_and_a_summary_already_converted(isolated_runs_dir, capsys):
    """No fakes: captures listed by ``tpudash.profiles.summary``, and a summary.json there read back as it is."""
    store, run_id = ended_run(isolated_runs_dir)
    add_capture(store, run_id)
    store.files(run_id).write(f"profile/plugins/profile/{CAPTURE}/summary.json", json.dumps(SUMMARY).encode())
    assert cli.main(["profile", run_id, "--list", "--json"]) == 0
    [listed] = json.loads(capsys.readouterr().out)["captures"]
    assert (listed["capture"], listed["hosts"], listed["has_summary"]) == (CAPTURE, ["vm"], True)
    assert cli.main(["profile", run_id, "--capture", CAPTURE, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["verdict"] == "input-bound" and printed["input_percent"] == 90.3
    assert printed["profile_dir"] == str(Path(store.find(run_id)) / "profile")


def test_a_capture_xprof_cannot_read_is_the_real_converters_sentence_and_exit_1(isolated_runs_dir, capsys):
    pytest.importorskip("xprof")
    store, run_id = ended_run(isolated_runs_dir)
    add_capture(store, run_id)  # "xplane": not a protobuf XProf can parse
    assert cli.main(["profile", run_id, "--capture", CAPTURE]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"tpudash: capture {CAPTURE}: the converter failed (exit ") and len(err.splitlines()) == 1
