"""Reliability of the headless CLI: bad input everywhere, jobs that fail, memory that runs out.

Bad input (a table of what users get wrong) always means exit 2, one line
naming the field and what is allowed, no traceback, no job started and no run
directory. A job that raises, or runs out of memory, is recorded as failed
with its error, and the same process runs the next job. A matmul too large
for this machine is bad input: the pre-flight memory check refuses it before
anything is allocated (exit 2, no run directory).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobs import get_job, registry
from jobs.base import JobSpec, Param
from jobs.events import Metric
from tests.conftest import REPO_ROOT
from tests.unit.test_cli import USER_UNSET
from tests.unit.test_config import lock_directory
from tpudash.cli import commands
from tpudash.cli import main as cli
from tpudash.runs.store import RunStore

TPUDASH_SCRIPT = Path(sys.executable).with_name("tpudash")


def run_dirs(runs_dir: Path) -> list[Path]:
    if not runs_dir.is_dir():
        return []
    return [path for path in runs_dir.iterdir() if path.is_dir() and not path.name.startswith(".")]


def needs_job(name: str):
    return pytest.mark.skipif(name not in registry(), reason=f"job {name!r} is not written yet")


@pytest.fixture
def places(tmp_path, monkeypatch):
    """Paths that cannot be used: a regular file, a directory nobody may read or write (root included)."""
    plain_file = tmp_path / "plain-file"
    plain_file.write_text("not a directory\n")
    locked = tmp_path / "locked"
    lock_directory(monkeypatch, locked)
    return {"file": str(plain_file), "locked": str(locked)}


# (argv, environment, fragments that must all appear in the message)
# "{file}" and "{locked}" stand for the paths of the `places` fixture.
BAD_INPUTS = [
    # --set values: wrong type
    pytest.param(
        ["run", "gradient-descent", "--set", "steps=many"],
        {},
        ["steps: 'many' is not an integer >= 1 and <= 100000"],
        id="int-word",
    ),
    pytest.param(
        ["run", "gradient-descent", "--set", "steps=2.5"], {}, ["steps: '2.5' is not an integer"], id="int-fraction"
    ),
    pytest.param(
        ["run", "gradient-descent", "--set", "steps=1e3"], {}, ["steps: '1e3' is not an integer"], id="int-exponent"
    ),
    pytest.param(
        ["run", "gradient-descent", "--set", "learning_rate=fast"],
        {},
        ["learning_rate: 'fast' is not a number > 0 and <= 100"],
        id="float-word",
    ),
    pytest.param(
        ["run", "gradient-descent", "--set", "start=1,x"],
        {},
        ["start: '1,x' is not comma-separated numbers (2 of them)"],
        id="floats-word",
    ),
    pytest.param(
        ["run", "matmul", "--set", "repeats=1.5"],
        {},
        ["repeats: '1.5' is not an integer >= 1 and <= 1000"],
        id="matmul-repeats-fraction",
    ),
    # NaN and infinities
    pytest.param(
        ["run", "gradient-descent", "--set", "learning_rate=nan"],
        {},
        ["learning_rate: nan is not a finite number", "allowed: a number > 0 and <= 100"],
        id="nan",
    ),
    pytest.param(
        ["run", "gradient-descent", "--set", "learning_rate=inf"],
        {},
        ["learning_rate: inf is not a finite number", "allowed: a number > 0"],
        id="inf",
    ),
    pytest.param(
        ["run", "gradient-descent", "--set", "learning_rate=1e309"],
        {},
        ["learning_rate: inf is not a finite number"],
        id="overflows-to-inf",
    ),
    pytest.param(
        ["run", "gradient-descent", "--set", "start=nan,1"], {}, ["start: nan is not a finite number"], id="nan-in-list"
    ),
    pytest.param(
        ["run", "matmul", "--set", "inject_error=-inf"],
        {},
        ["inject_error: -inf is not a finite number", "allowed: a number >= 0"],
        id="minus-inf",
    ),
    pytest.param(
        ["run", "all-reduce", "--set", "size_mb=inf"],
        {},
        ["size_mb: inf is not a finite number", "allowed: a number > 0 and <= 1024"],
        id="all-reduce-inf",
    ),
    # negative, zero, huge
    pytest.param(
        ["run", "gradient-descent", "--set", "learning_rate=-0.1"],
        {},
        ["learning_rate: -0.1 is out of range; allowed: a number > 0 and <= 100"],
        id="negative-float",
    ),
    pytest.param(
        ["run", "gradient-descent", "--set", "steps=-5"],
        {},
        ["steps: -5 is out of range; allowed: an integer >= 1 and <= 100000"],
        id="negative-int",
    ),
    pytest.param(
        ["run", "gradient-descent", "--set", "learning_rate=0"],
        {},
        ["learning_rate: 0 is out of range; allowed: a number > 0"],
        id="zero-exclusive",
    ),
    pytest.param(
        ["run", "matmul", "--set", "m=0"],
        {},
        ["m: 0 is out of range; allowed: an integer >= 1 and <= 65536"],
        id="zero-dimension",
    ),
    pytest.param(
        ["run", "all-reduce", "--set", "size_mb=0"],
        {},
        ["size_mb: 0 is out of range; allowed: a number > 0 and <= 1024"],
        id="zero-size",
    ),
    pytest.param(
        ["run", "gradient-descent", "--set", "steps=99999999999999999999"],
        {},
        ["steps: 99999999999999999999 is out of range; allowed: an integer >= 1 and <= 100000"],
        id="huge-int",
    ),
    pytest.param(
        ["run", "gradient-descent", "--set", "learning_rate=1e300"],
        {},
        ["learning_rate: 1e+300 is out of range; allowed: a number > 0 and <= 100"],
        id="huge-float",
    ),
    pytest.param(
        ["run", "matmul", "--set", "n=100000"],
        {},
        ["n: 100000 is out of range; allowed: an integer >= 1 and <= 65536"],
        id="huge-dimension",
    ),
    pytest.param(
        ["run", "dtensor-mlp", "--set", "hidden=65536,65536"],
        {},
        ["hidden: 65536,65536 makes 4,347,133,962 parameters", "GiB of host memory", "use smaller layers"],
        id="huge-layers",
    ),
    pytest.param(
        ["run", "gradient-descent", "--set", "momentum=1"],
        {},
        ["momentum: 1 is out of range; allowed: a number >= 0 and <= 0.999"],
        id="momentum-one",
    ),
    pytest.param(
        ["run", "replica-dataset", "--set", "n=10001"],
        {},
        ["n: 10001 is out of range; allowed: an integer >= 1 and <= 10000"],
        id="dataset-too-long",
    ),
    # empty values
    pytest.param(
        ["run", "gradient-descent", "--set", "steps="],
        {},
        ["steps: is empty; allowed: an integer >= 1 and <= 100000"],
        id="empty-int",
    ),
    pytest.param(
        ["run", "gradient-descent", "--set", "learning_rate= "],
        {},
        ["learning_rate: is empty; allowed: a number > 0"],
        id="blank-float",
    ),
    pytest.param(
        ["run", "matmul", "--set", "devices="],
        {},
        ["devices: '' is not a device index", "allowed: all, or comma-separated device indices"],
        id="empty-devices",
    ),
    pytest.param(
        ["run", "gradient-descent", "--set", "start=1"], {}, ["start: needs 2 values, got 1"], id="too-few-values"
    ),
    # unknown names
    pytest.param(
        ["run", "gradient-descent", "--set", "nope=1"],
        {},
        ["nope: unknown param for job 'gradient-descent'; allowed: objective, optimizer, learning_rate"],
        id="unknown-param",
    ),
    pytest.param(
        ["run", "matmul", "--set", "M=4"],
        {},
        ["M: unknown param for job 'matmul'; allowed: m, k, n"],
        id="param-names-are-case-sensitive",
    ),
    pytest.param(
        ["run", "no-such-job"],
        {},
        ["unknown job 'no-such-job'; allowed: matmul, replica-matmul, replica-dataset, all-reduce, gradient-descent"],
        id="unknown-job",
    ),
    pytest.param(["run", "Matmul"], {}, ["unknown job 'Matmul'; allowed: matmul"], id="job-names-are-case-sensitive"),
    # bad choices
    pytest.param(
        ["run", "matmul", "--set", "dtype=float64"],
        {},
        ["dtype: 'float64' is not allowed; allowed: one of float32, bfloat16, float16"],
        id="unknown-dtype",
    ),
    pytest.param(
        ["run", "replica-dataset", "--set", "fn=cube"],
        {},
        ["fn: 'cube' is not allowed; allowed: one of double, square, identity"],
        id="unknown-fn",
    ),
    pytest.param(
        ["run", "gradient-descent", "--set", "objective=cubic"],
        {},
        ["objective: 'cubic' is not allowed; allowed: one of quadratic, rosenbrock"],
        id="unknown-objective",
    ),
    pytest.param(
        ["run", "gradient-descent", "--set", "optimizer=rmsprop"],
        {},
        ["optimizer: 'rmsprop' is not allowed; allowed: one of sgd, momentum, adam"],
        id="unknown-optimizer",
    ),
    pytest.param(
        ["run", "replica-matmul", "--set", "source=file"],
        {},
        ["source: 'file' is not allowed; allowed: one of guide, random"],
        id="unknown-source",
    ),
    # combinations and what depends on this session's devices
    pytest.param(
        ["run", "replica-matmul", "--set", "m=5"],
        {},
        ["source: m, k and n apply only to source=random"],
        id="combination",
    ),
    pytest.param(
        ["run", "matmul", "--set", "devices=0,x"],
        {},
        ["devices: 'x' is not a device index or range like 0-3"],
        id="bad-device-list",
    ),
    pytest.param(
        ["run", "matmul", "--set", "devices=3,3"], {}, ["devices: device 3 is listed twice"], id="device-twice"
    ),
    pytest.param(
        ["run", "matmul", "--set", "devices=8"],
        {},
        ["devices: device 8 is out of range; this session has 8 devices (0-7)"],
        id="device-not-in-session",
    ),
    pytest.param(
        ["run", "gradient-descent", "--set", "device=99999999999999999999999"],
        {},
        ["device: 99999999999999999999999 is out of range; this session has 8 devices (0-7)"],
        id="huge-device-index",
    ),
    pytest.param(
        ["run", "matmul", "--set", "inject_error=0.1", "--set", "inject_device=5", "--set", "devices=0,1"],
        {},
        ["inject_device: 5 is not among the devices checked (0,1)"],
        id="inject-outside-selection",
    ),
    # malformed --set
    pytest.param(
        ["run", "gradient-descent", "--set", "steps"], {}, ["steps: expected NAME=VALUE"], id="set-without-equals"
    ),
    pytest.param(["run", "gradient-descent", "--set", "=5"], {}, ["=5: expected NAME=VALUE"], id="set-without-name"),
    pytest.param(["run", "gradient-descent", "--set", ""], {}, ["--set: expected NAME=VALUE"], id="set-empty"),
    # the train and dtensor-mlp forms
    pytest.param(
        ["run", "train", "--set", "dataset=imagenet"],
        {},
        ["dataset: 'imagenet' is not allowed; allowed: one of mnist"],
        id="train-unknown-dataset",
        marks=needs_job("train"),
    ),
    pytest.param(
        ["run", "train", "--set", "model=resnet"],
        {},
        ["model: 'resnet' is not allowed; allowed: one of light"],
        id="train-unknown-model",
        marks=needs_job("train"),
    ),
    pytest.param(
        ["run", "train", "--set", "precision=float64"],
        {},
        ["precision: 'float64' is not allowed; allowed: one of float32, mixed_bfloat16, mixed_float16"],
        id="train-unknown-precision",
        marks=needs_job("train"),
    ),
    pytest.param(
        ["run", "train", "--set", "batch_per_replica=0"],
        {},
        ["batch_per_replica: 0 is out of range; allowed: an integer >= 1"],
        id="train-zero-batch",
        marks=needs_job("train"),
    ),
    pytest.param(
        ["run", "train", "--set", "learning_rate=nan"],
        {},
        ["learning_rate: nan is not a finite number"],
        id="train-nan-learning-rate",
        marks=needs_job("train"),
    ),
    pytest.param(
        ["run", "train", "--set", "deterministic=maybe"],
        {},
        ["deterministic: 'maybe' is not true/false, yes/no, on/off, 1/0 (any case)"],
        id="train-not-a-bool",
        marks=needs_job("train"),
    ),
    pytest.param(
        ["run", "train", "--set", "limit_train=10"],
        {},
        ["limit_train: 10 is fewer than one global batch (64 per replica × 8 replicas = 512)"],
        id="train-limit-below-one-batch",
        marks=needs_job("train"),
    ),
    pytest.param(
        ["run", "train", "--set", "profile_steps=10-5"],
        {},
        ["profile_steps: '10-5' is not a step range", "allowed: empty (no profiling), N, or N-M"],
        id="train-backwards-profile-range",
        marks=needs_job("train"),
    ),
    pytest.param(
        ["run", "dtensor-mlp", "--set", "hidden=0"],
        {},
        ["hidden: 0 is out of range; allowed: comma-separated integers >= 1"],
        id="dtensor-zero-layer",
        marks=needs_job("dtensor-mlp"),
    ),
    pytest.param(
        ["run", "dtensor-mlp", "--set", "batch_size=3"],
        {},
        ["batch_size: 3 does not split evenly over the mesh's 8 devices; allowed: a multiple of 8"],
        id="dtensor-uneven-batch",
        marks=needs_job("dtensor-mlp"),
    ),
    # session flags and their TPUDASH_* variables
    pytest.param(
        ["--cpu-devices", "0", "run", "gradient-descent"],
        {},
        ["--cpu-devices: 0 is out of range; allowed: 1 to 256"],
        id="cpu-devices-zero",
    ),
    pytest.param(
        ["run", "gradient-descent", "--cpu-devices", "-1"],
        {},
        ["--cpu-devices: -1 is out of range; allowed: 1 to 256"],
        id="cpu-devices-negative",
    ),
    pytest.param(
        ["--cpu-devices", "100000", "devices"],
        {},
        ["--cpu-devices: 100000 is out of range; allowed: 1 to 256"],
        id="cpu-devices-absurd",
    ),
    pytest.param(
        ["--cpu-devices", "eight", "run", "matmul"],
        {},
        ["--cpu-devices: 'eight' is not an integer; allowed: 1 to 256"],
        id="cpu-devices-word",
    ),
    pytest.param(
        ["run", "matmul"],
        {"TPUDASH_CPU_DEVICES": "0"},
        ["TPUDASH_CPU_DEVICES: 0 is out of range; allowed: 1 to 256"],
        id="cpu-devices-variable",
    ),
    pytest.param(
        ["--tpu", " ", "devices"],
        {},
        ["--tpu: is empty; allowed: a TPU name, grpc://host:port, 'local' or 'none'"],
        id="tpu-empty",
    ),
    pytest.param(
        ["--data-dir", "{file}", "run", "gradient-descent"],
        {},
        ["--data-dir: {file} is not a readable directory"],
        id="data-dir-is-a-file",
    ),
    pytest.param(
        ["--data-dir", "{locked}", "run", "gradient-descent"],
        {},
        ["--data-dir: {locked} is not a readable directory"],
        id="data-dir-unreadable",
    ),
    pytest.param(
        ["run", "gradient-descent"],
        {"TPUDASH_DATA_DIR": "{file}"},
        ["TPUDASH_DATA_DIR: {file} is not a readable directory"],
        id="data-dir-variable",
    ),
    pytest.param(
        ["--data-dir", "", "run", "gradient-descent"],
        {},
        ["--data-dir: is empty; allowed: a directory path"],
        id="data-dir-empty",
    ),
    pytest.param(
        ["--runs-dir", "{file}/runs", "run", "gradient-descent"],
        {},
        ["--runs-dir: {file}/runs cannot be a directory: {file} is a file"],
        id="runs-dir-under-a-file",
    ),
    pytest.param(
        ["run", "gradient-descent", "--runs-dir", "{file}"],
        {},
        ["--runs-dir / TPUDASH_RUNS_DIR: cannot create {file}: File exists"],
        id="runs-dir-is-a-file",
    ),
    pytest.param(
        ["run", "gradient-descent"],
        {"TPUDASH_RUNS_DIR": "{file}/runs"},
        ["TPUDASH_RUNS_DIR: {file}/runs cannot be a directory: {file} is a file"],
        id="runs-dir-variable-under-a-file",
    ),
    pytest.param(
        ["--runs-dir", "{locked}/runs", "run", "gradient-descent"],
        {},
        ["--runs-dir / TPUDASH_RUNS_DIR: cannot create {locked}/runs: Permission denied"],
        id="runs-dir-unwritable",
    ),
    pytest.param(
        ["--runs-dir", "", "run", "gradient-descent"],
        {},
        ["--runs-dir: is empty; allowed: a directory path"],
        id="runs-dir-empty",
    ),
    pytest.param(
        ["runs", "--runs-dir", "{file}"],
        {},
        ["--runs-dir / TPUDASH_RUNS_DIR: {file} is not a directory"],
        id="runs-listing-a-file",
    ),
    # export
    pytest.param(["export", "no-such-run"], {}, ["no run 'no-such-run' in"], id="export-unknown-run"),
    pytest.param(
        ["export", ""], {}, ["'' is not a run id: a run id is the name of a directory"], id="export-empty-run-id"
    ),
    pytest.param(
        ["export", "../.."],
        {},
        ["'../..' is not a run id: a run id is the name of a directory"],
        id="export-path-as-run-id",
    ),
    pytest.param(
        ["export", "x", "--format", "xml"],
        {},
        ["argument --format: invalid choice: 'xml'", "csv", "json"],
        id="export-bad-format",
    ),
    pytest.param(
        ["export", "x", "--runs-dir", "{file}"],
        {},
        ["--runs-dir / TPUDASH_RUNS_DIR: {file} is not a directory"],
        id="export-from-a-file",
    ),
    # argparse's own errors
    pytest.param(["run"], {}, ["the following arguments are required: job"], id="run-without-job"),
    pytest.param(["launch", "matmul"], {}, ["argument COMMAND: invalid choice: 'launch'"], id="unknown-command"),
    pytest.param(["run", "matmul", "--sett", "m=4"], {}, ["unrecognized arguments: --sett m=4"], id="misspelt-flag"),
]


def fill(text: str, places: dict) -> str:
    return text.format(**places)


def main_in_process(argv, monkeypatch, capsys) -> tuple[int, str, str, list]:
    """``cli.main(argv)``, argparse's SystemExit included, with job starts recorded instead of run."""
    started = []
    monkeypatch.setattr(
        commands, "execute_headless", lambda spec, params, *args, **kwargs: started.append(spec.name) or 0
    )
    try:
        code = cli.main(argv)
    except SystemExit as exited:
        code = exited.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err, started


@pytest.mark.parametrize(("argv", "environment", "fragments"), BAD_INPUTS)
def test_bad_input_exits_2_naming_the_field_with_no_job_and_no_run_directory(
    argv, environment, fragments, places, isolated_runs_dir, runtime, monkeypatch, capsys
):
    argv = [fill(arg, places) for arg in argv]
    for name, value in environment.items():
        monkeypatch.setenv(name, fill(value, places))
    monkeypatch.setenv("COLUMNS", "80")

    code, out, err, started = main_in_process(argv, monkeypatch, capsys)

    assert code == 2, f"exit {code}; stderr: {err}"
    for fragment in fragments:
        assert fill(fragment, places) in err
    assert err.splitlines()[-1].startswith("tpudash: error: ")
    assert "Traceback" not in out + err
    assert started == []
    assert run_dirs(isolated_runs_dir) == []


SAME_FOR_THE_USER = [
    pytest.param(["run", "no-such-job"], id="unknown-job"),
    pytest.param(["run", "gradient-descent", "--set", "learning_rate=nan"], id="nan"),
    pytest.param(["run", "gradient-descent", "--set", "steps"], id="set-without-equals"),
    pytest.param(["--cpu-devices", "0", "run", "matmul"], id="cpu-devices-zero"),
    pytest.param(["--runs-dir", "{file}/runs", "run", "gradient-descent"], id="runs-dir-under-a-file"),
    pytest.param(["export", "x", "--format", "xml"], id="export-bad-format"),
]


@pytest.mark.parametrize("argv", SAME_FOR_THE_USER)
def test_the_console_script_shows_the_user_the_same_message_and_exit_code(
    argv, places, isolated_runs_dir, monkeypatch, capsys
):
    argv = [fill(arg, places) for arg in argv]
    monkeypatch.setenv("COLUMNS", "80")
    code, _, in_process_err, _ = main_in_process(argv, monkeypatch, capsys)

    environment = {key: value for key, value in os.environ.items() if key not in USER_UNSET}
    result = subprocess.run(
        [str(TPUDASH_SCRIPT), *argv], capture_output=True, text=True, cwd=REPO_ROOT, env=environment, timeout=120
    )

    assert result.returncode == code == 2
    assert result.stderr == in_process_err
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert run_dirs(isolated_runs_dir) == []


# -- jobs that fail -------------------------------------------------------------------


def failing_job(ctx, params):
    for step in range(2):
        ctx.emit(Metric("loss", 1.0 / (step + 1), step))
    if params["error"] == "memory":
        raise MemoryError("the job asked for more than there is")
    raise ValueError("the model diverged at step 2")


FAILING = JobSpec(
    "explode",
    "Explode",
    "reports two steps, then raises",
    (Param("error", "str", "value", choices=("value", "memory")),),
    failing_job,
)


@pytest.fixture
def with_failing_job(monkeypatch):
    monkeypatch.setitem(registry(), FAILING.name, FAILING)
    return FAILING


@pytest.mark.parametrize(
    ("error", "message"),
    [
        ("value", "ValueError: the model diverged at step 2"),
        ("memory", "MemoryError: the job asked for more than there is"),
    ],
)
def test_a_job_that_raises_is_recorded_failed_with_its_metrics_and_the_next_job_runs(
    error, message, with_failing_job, isolated_runs_dir, capsys
):
    assert cli.main(["run", "explode", "--set", f"error={error}", "--json"]) == 1
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert events[-1]["type"] == "run_finished" and events[-1]["status"] == "failed"
    assert events[-1]["error"] == message
    assert "failing_job" in events[-1]["traceback"]

    data = RunStore(isolated_runs_dir).load(events[0]["run_id"])
    assert data.info.status == "failed" and data.info.error == message
    assert [(metric.step, metric.value) for _, metric in data.metrics()] == [(0, 1.0), (1, 0.5)]

    # Same process, next job: it runs to the end.
    assert cli.main(["run", "gradient-descent", "--set", "steps=3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["status"] == "done"


def test_a_failing_job_shows_its_error_but_no_traceback_in_the_human_view(with_failing_job, capsys):
    assert cli.main(["run", "explode"]) == 1
    captured = capsys.readouterr()
    assert "failed" in captured.out
    assert "error: ValueError: the model diverged at step 2" in captured.out
    assert "Traceback" not in captured.out + captured.err


def test_a_matmul_too_big_for_this_machine_is_refused_before_it_starts_and_the_next_one_runs(
    isolated_runs_dir, runtime, capsys
):
    huge = ["run", "matmul", "--set", "m=65536", "--set", "k=65536", "--set", "n=65536"]
    assert cli.main(huge) == 2
    err = capsys.readouterr().err
    assert "m=65536, k=65536, n=65536 (float32) needs " in err
    assert " GiB of host memory, " in err and " GiB available; lower m, k or n" in err
    assert "Traceback" not in err
    assert run_dirs(isolated_runs_dir) == []

    assert cli.main(["run", "matmul", "--set", "m=64", "--set", "k=64", "--set", "n=64", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["status"] == "done"


def test_the_memory_check_counts_the_dtype_and_names_the_largest_dimension(runtime):
    from jobs.base import ParamError
    from jobs.hostmemory import GIB
    from jobs.matmul import check_memory, host_memory_needed

    spec = get_job("matmul")
    narrow = spec.resolve({"m": "4096", "k": "64", "n": "8192", "dtype": "bfloat16"})
    wide = spec.resolve({"m": "4096", "k": "64", "n": "8192", "dtype": "float32"})
    assert host_memory_needed(wide, True) > host_memory_needed(narrow, True)
    # An accelerator holds its own copies; the host does not hold them too.
    assert host_memory_needed(wide, False) < host_memory_needed(wide, True)
    check_memory(wide, runtime, available_host=host_memory_needed(wide, True))
    with pytest.raises(ParamError) as raised:
        check_memory(wide, runtime, available_host=GIB // 4)
    assert raised.value.field == "n"
    assert raised.value.message.endswith("GiB of host memory, 0.2 GiB available; lower m, k or n")


def test_the_all_reduce_counts_every_replicas_copies_against_host_memory(runtime):
    from jobs.all_reduce import check_all_reduce_memory
    from jobs.base import ParamError
    from jobs.hostmemory import GIB

    spec = get_job("all-reduce")
    spec.check_runtime(spec.resolve({}), runtime)  # the default fits anywhere
    with pytest.raises(ParamError) as raised:
        check_all_reduce_memory(spec.resolve({"size_mb": "512"}), runtime, available_host=GIB)
    assert raised.value.field == "size_mb"
    # 512 MiB × 8 replicas × (input, result, buffer) = 12 GiB.
    assert raised.value.message == (
        "512 MiB on each of 8 replicas needs 12.0 GiB of host memory, 1.0 GiB available; allowed here: at most 43"
    )


def test_the_dtensor_mlp_counts_the_replicated_weights_and_adam_state(runtime):
    from jobs.base import ParamError
    from jobs.dtensor_mlp import check_memory, parameter_count
    from jobs.hostmemory import GIB

    spec = get_job("dtensor-mlp")
    assert parameter_count(784, (700, 500), 10) == 784 * 700 + 700 + 700 * 500 + 500 + 500 * 10 + 10
    spec.check_runtime(spec.resolve({}), runtime)  # the DTensor MNIST example's 784→700→500→10
    with pytest.raises(ParamError) as raised:
        check_memory(spec.resolve({"hidden": "4096,4096"}), runtime, available_host=GIB)
    assert raised.value.field == "hidden"
    assert "makes 20,037,642 parameters; replicated on 8 devices" in raised.value.message
    assert raised.value.message.endswith("1.0 GiB available; use smaller layers")


def _overcommit_refuses(size: int) -> bool:
    """Whether the kernel refuses one allocation of ``size`` bytes outright (no memory touched)."""
    try:
        mode = Path("/proc/sys/vm/overcommit_memory").read_text().strip()
        meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    except OSError:
        return False
    total = sum(int(meminfo.get(key, "0 kB").split()[0]) * 1024 for key in ("MemTotal", "SwapTotal"))
    return mode in ("0", "2") and size > total


REFERENCE_BYTES = 65536 * 65536 * 8


@pytest.mark.skipif(not _overcommit_refuses(REFERENCE_BYTES), reason="this machine might really hand out 32 GiB")
def test_an_allocation_that_fails_mid_run_is_recorded_failed_with_a_clear_message(
    isolated_runs_dir, runtime, monkeypatch, capsys
):
    """Memory taken by something else after the check: the real allocator says no."""
    import jobs.matmul

    # Pretend the pre-flight saw plenty; the 32 GiB float64 reference then fails for real.
    monkeypatch.setattr(jobs.matmul, "available_host_bytes", lambda: 2**60)
    code = cli.main(
        ["run", "matmul", "--set", "m=65536", "--set", "k=1", "--set", "n=65536", "--set", "devices=0", "--json"]
    )
    assert code == 1
    finished = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert finished["status"] == "failed"
    assert finished["error"].startswith("OutOfMemory: out of memory for m=65536, k=1, n=65536 (float32): ")
    assert "32.0 GiB" in finished["error"] and finished["error"].endswith("; lower m, k or n")
    [info] = RunStore(isolated_runs_dir).list_runs()
    assert info.status == "failed" and info.error == finished["error"]

    assert cli.main(["run", "matmul", "--set", "m=64", "--set", "k=64", "--set", "n=64", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["status"] == "done"


def test_the_accelerators_out_of_memory_error_becomes_a_clear_failed_run(run_job, monkeypatch):
    import tensorflow as tf

    import jobs.matmul

    def exhausted_multiply(tf_module):
        def multiply(a, b):
            raise tf.errors.ResourceExhaustedError(
                None, None, "OOM when allocating tensor with shape[64,64] on CPU:0\nmore detail"
            )

        return multiply

    monkeypatch.setattr(jobs.matmul, "make_multiply", exhausted_multiply)
    result = run_job("matmul", m=64, k=64, n=64, devices="0")
    assert result.status == "failed"
    assert result.finished.error == (
        "OutOfMemory: out of memory for m=64, k=64, n=64 (float32): "
        "OOM when allocating tensor with shape[64,64] on CPU:0; lower m, k or n"
    )
    assert result.finished.error.split(": ", 1)[1] in result.logs()
    monkeypatch.undo()
    assert run_job("matmul", m=64, k=64, n=64, devices="0").status == "done"


# -- the reader of standard output goes away ---------------------------------------------------


class ReaderGoesAway:
    """Standard output piped into something like ``head -1``: after ``lines`` writes the pipe is closed."""

    def __init__(self, lines: int):
        self.lines = lines
        self.written: list[str] = []

    def write(self, text: str) -> int:
        if len(self.written) >= self.lines:
            raise BrokenPipeError(32, "Broken pipe")
        self.written.append(text)
        return len(text)

    def flush(self) -> None:
        pass


@pytest.mark.parametrize("view", [["--json"], []], ids=["json", "human"])
def test_when_the_reader_of_standard_output_goes_away_the_run_is_cancelled_quietly(
    view, isolated_runs_dir, runtime, monkeypatch, capsys
):
    # A context, so sys.stdout is back before capsys's own teardown.
    with monkeypatch.context() as patch:
        patch.setattr(sys, "stdout", ReaderGoesAway(lines=1))
        code = cli.main(["run", "gradient-descent", "--set", "steps=20000", *view])
    err = capsys.readouterr().err

    assert code == 130
    assert err.count("tpudash: standard output was closed; cancelling gradient-descent") == 1
    assert "Traceback" not in err and "BrokenPipeError" not in err
    [info] = RunStore(isolated_runs_dir).list_runs()
    assert info.status == "cancelled"
    # The pipe closed before the first step; at most one more step ran.
    assert sum(1 for _, event in RunStore(isolated_runs_dir).load(info.run_id).metrics() if event.name == "loss") <= 1
