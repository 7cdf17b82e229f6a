"""A crashed engine's reason is its real last error lines, not TensorFlow's start-up noise (issue 38, item 12).

The sample (``tests/engine_crash_stderr.txt``) is the real stderr of a
process that imported TensorFlow on a CPU machine and then segfaulted:
absl's "before InitializeLog" warning, oneDNN's notice, "Could not find cuda
drivers", a failed cuInit, each start-up line twice, then Python's fault
report and its list of extension modules.
"""

from __future__ import annotations

import threading

import pytest

from tests.crashing_engine import CRASH_STDERR, CRASHING_ENGINE
from tpudash.accel.nativelog import crash_reason_lines, is_startup_noise
from tpudash.config import Settings
from tpudash.engine.handle import EngineExit, EngineProcess

SAMPLE = CRASH_STDERR.read_text(encoding="utf-8").splitlines()
REAL_LINES = [
    "Fatal Python error: Segmentation fault",
    "Current thread 0x00007f59c302eb80 (most recent call first):",
    '  File "/root/.pyenv/versions/3.11.7/lib/python3.11/ctypes/__init__.py", line 519 in string_at',
    '  File "<string>", line 6 in train_step',
    '  File "<string>", line 7 in <module>',
]


def test_the_sample_is_mostly_tensorflows_start_up_noise():
    text = "\n".join(SAMPLE)
    for noise in (
        "All log messages before absl::InitializeLog()",
        "oneDNN custom operations are on",
        "Could not find cuda drivers",
        "failed call to cuInit",
    ):
        assert text.count(noise) >= 1, noise


def test_the_reason_kept_from_a_crash_is_its_real_last_lines():
    kept, noise = crash_reason_lines(SAMPLE, 12)
    assert kept == REAL_LINES
    assert noise == 8  # 2 × (absl's warning, oneDNN, cuda drivers), a cuInit error, the extension modules


def test_only_the_last_lines_asked_for_are_kept():
    assert crash_reason_lines(SAMPLE, 2) == (REAL_LINES[-2:], 8)
    assert crash_reason_lines(SAMPLE, 0) == ([], 8)
    assert crash_reason_lines([], 12) == ([], 0)
    assert crash_reason_lines(["", "   "], 12) == ([], 0)  # blank lines are neither reason nor noise


@pytest.mark.parametrize(
    "line",
    [
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
        "I0000 00:00:1795828360.286231   18973 port.cc:153] oneDNN custom operations are on. You may see …",
        "I0000 00:00:1795828360.286584   18973 cudart_stub.cc:31] Could not find cuda drivers on your machine, …",
        "E0000 00:00:1795828363.402213   18973 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error",
        "W1128 01:02:03.456789   18973 cuda_dnn.cc:8310] Unable to register cuDNN factory: Attempting to …",
        "2024-01-02 03:04:05.678901: I tensorflow/core/platform/cpu_feature_guard.cc:182] This TensorFlow binary "
        "is optimized to use available CPU instructions in performance-critical operations.",
        "2024-01-02 03:04:05.678901: W tensorflow/compiler/tf2tensorrt/utils/py_utils.cc:38] TF-TRT Warning: "
        "Could not find TensorRT",
        "W0000 00:00:1795828363.402213   18973 local_rendezvous.cc:404] Local rendezvous is aborting with status: "
        "OUT_OF_RANGE: End of sequence",
        "I0000 00:00:1795828363.402213   18973 service.cc:148] XLA service 0x55d0 initialized for platform Host",
        "Extension modules: numpy._core._multiarray_umath, psutil._psutil_linux (total: 2)",
        "To enable the following instructions: AVX2 AVX512F FMA, in other operations, rebuild TensorFlow with the "
        "appropriate compiler flags.",
    ],
)
def test_tensorflows_absls_and_xlas_start_up_lines_are_noise(line):
    assert is_startup_noise(line)


@pytest.mark.parametrize(
    "line",
    [
        "F0000 00:00:1795828363.402213   18973 tpu_driver.cc:42] Check failed: device lost",
        "F0000 00:00:1795828363.402213   18973 port.cc:153] oneDNN custom operations are on",  # fatal: never noise
        "E0000 00:00:1795828363.402213   18973 tpu_compile.cc:77] RESOURCE_EXHAUSTED: Ran out of memory in HBM",
        "W1128 01:02:03.456789   18973 allocator.cc:122] Allocation of 419430400 exceeds 10% of free memory.",
        "2024-01-02 03:04:05.678901: E tensorflow/core/tpu/tpu_driver.cc:42] TPU halted",
        "Fatal Python error: Segmentation fault",
        "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor",
        "ValueError: failed call to cuInit in my own code",  # noise words, but not absl's line
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR, and more",
        "I0000 this is not absl's prefix: oneDNN custom operations are on",
    ],
)
def test_errors_and_warnings_that_say_something_are_kept(line):
    assert not is_startup_noise(line)


def test_the_crash_message_names_the_real_error_or_says_there_was_only_noise():
    crashed = EngineExit.from_stderr(-11, "SIGSEGV", SAMPLE, requested=False)
    assert crashed.stderr_tail == REAL_LINES and crashed.stderr_noise == 8
    words = crashed.stderr_words()
    assert words == "; its last stderr lines: " + " | ".join(REAL_LINES)
    assert "oneDNN" not in words and "cuda" not in words and "absl" not in words
    killed = EngineExit.from_stderr(-9, "SIGKILL", SAMPLE[:7], requested=False)  # the OOM killer: no last words
    assert killed.stderr_tail == []
    assert killed.stderr_words() == (
        "; its stderr held only TensorFlow's start-up messages (the session log keeps them)"
    )
    assert EngineExit.from_stderr(-9, "SIGKILL", [], requested=False).stderr_words() == ""


def test_a_crashed_engine_process_reports_its_real_last_lines_and_the_session_log_keeps_everything(tmp_path):
    log_path = tmp_path / "session.log"
    log_path.write_text("an earlier engine's line\n")  # before this engine: not its stderr
    exits: list[EngineExit] = []
    exited = threading.Event()

    def listener(news) -> None:
        if isinstance(news, EngineExit):
            exits.append(news)
            exited.set()

    settings = Settings.load({"runs_dir": str(tmp_path / "runs")})
    EngineProcess(listener, settings, log_path, module=CRASHING_ENGINE)
    assert exited.wait(60)
    (crash,) = exits
    assert crash.signal_name == "SIGSEGV" and not crash.requested
    assert crash.stderr_tail == REAL_LINES and crash.stderr_noise == 8
    logged = log_path.read_text(encoding="utf-8")
    assert logged == "an earlier engine's line\n" + CRASH_STDERR.read_text(encoding="utf-8")


def test_a_failed_cluster_worker_is_named_with_its_real_last_lines(tmp_path):
    from types import SimpleNamespace

    from tpudash.engine.cluster import ClusterLaunch, WorkerLog

    launch = ClusterLaunch(
        job="train",
        params={},
        run_id="20261128-000000-train-abcdef",
        count=2,
        store=SimpleNamespace(local_dir=lambda run_id: tmp_path / run_id),
        environment={},
        on_event=lambda timestamp, event: None,
    )
    launch.addresses = ["127.0.0.1:1", "127.0.0.1:2"]
    launch.logs = [WorkerLog(tmp_path / "worker-0.log"), WorkerLog(tmp_path / "worker-1.log")]
    for line in SAMPLE:
        launch.logs[1].add(line + "\n")
    outcome = launch._lost(1, 1)
    assert outcome.error.startswith(
        "worker 1 (127.0.0.1:2) failed: exited with status 1; its last lines: " + " | ".join(REAL_LINES[-5:])
    ), outcome.error
    assert "oneDNN" not in outcome.error and "Extension modules" not in outcome.error
    assert outcome.traceback is not None and "oneDNN" in outcome.traceback  # the whole tail stays in the record

    for line in SAMPLE[:7]:
        launch.logs[0].add(line + "\n")
    assert "its last lines: only TensorFlow's start-up messages (its log:" in launch._lost(0, 1).error
