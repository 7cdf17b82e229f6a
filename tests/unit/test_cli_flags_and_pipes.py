"""The command line's promises about where flags go and where output goes.

Every global flag means the same before or after any command (the README's
promise); a reader that closes the pipe early ends any command quietly with 0.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from jobs.events import Metric, RunFinished
from tests.conftest import REPO_ROOT
from tests.unit.test_cli import USER_UNSET
from tpudash.cli import main as cli
from tpudash.runs.layout import new_run_id
from tpudash.runs.store import RunStore

# A value each global flag accepts, as a user types it.
FLAG_VALUES = {
    "tpu": "none",
    "cpu_devices": "4",
    "framework": "jax",
    "data_dir": "/tmp/tfds",
    "runs_dir": "/tmp/runs",
    "tpu_metrics": "localhost:8431",
    "telemetry_interval": "2",
    "store_timeout": "5",
    "release_after": "5",
    "cancel_grace": "3",
}
# What each command needs after its name to parse.
COMMAND_ARGUMENTS = {
    "export": ["20260101-000000-matmul-abcdef"],
    "run": ["matmul"],
    "copy": ["20260101-000000-matmul-abcdef", "/tmp/copies"],
    "advise": ["20260101-000000-train-abcdef"],
}


def test_every_global_flag_has_a_value_here():
    assert set(FLAG_VALUES) == set(cli.GLOBAL_FLAGS + cli.DASHBOARD_FLAGS)


@pytest.mark.parametrize("command", list(cli.COMMANDS))
@pytest.mark.parametrize("flag", list(FLAG_VALUES))
def test_a_global_flag_means_the_same_before_and_after_every_command(command, flag, capsys):
    option = [f"--{flag.replace('_', '-')}", FLAG_VALUES[flag]]
    rest = COMMAND_ARGUMENTS.get(command, [])
    parser = cli.build_parser()

    before = parser.parse_args([*option, command, *rest])
    after = parser.parse_args([command, *rest, *option])

    assert capsys.readouterr().err == ""  # no "unrecognized arguments"
    assert getattr(before, flag) == getattr(after, flag) == FLAG_VALUES[flag]
    assert cli.load_settings(before) == cli.load_settings(after)


def test_serve_takes_release_after_after_the_command_as_the_issue_tried_it():
    args = cli.build_parser().parse_args(["serve", "--release-after", "5"])
    assert cli.load_settings(args).release_after == 5


# -- a reader that stops reading ---------------------------------------------------------------


def run_into_a_closed_pipe(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """``tpudash ARGV | head`` where head has already gone: every write to standard output fails."""
    reader, writer = os.pipe()
    os.close(reader)  # before the command runs, so its very first write meets a closed pipe
    environment = {key: value for key, value in os.environ.items() if key not in USER_UNSET}
    environment.update(env)
    try:
        return subprocess.run(
            [sys.executable, "-m", "tpudash", *argv],
            stdout=writer,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
            env=environment,
            timeout=120,
        )
    finally:
        os.close(writer)


@pytest.mark.parametrize(
    "argv",
    [
        ["jobs"],
        ["jobs", "--json"],
        ["runs"],
        ["runs", "--json"],
        ["export", "RUN"],
        ["run", "matmul", "--help"],
        ["--help"],
        ["telemetry", "--once", "--json"],
    ],
    ids=" ".join,
)
def test_a_closed_pipe_ends_every_command_quietly_with_0(argv, isolated_runs_dir):
    store = RunStore(isolated_runs_dir)
    run_id = new_run_id("matmul")
    store.create(run_id, "matmul", {}, {}).record(RunFinished(status="done"))
    argv = [run_id if word == "RUN" else word for word in argv]

    result = run_into_a_closed_pipe(*argv, env={"TPUDASH_RUNS_DIR": str(isolated_runs_dir)})

    assert (result.returncode, result.stderr) == (0, "")


# -- tpudash runs into a pipe ------------------------------------------------------------------


def test_runs_into_a_pipe_at_80_columns_is_one_whole_line_per_run(isolated_runs_dir, monkeypatch, capsys):
    store = RunStore(isolated_runs_dir)
    endings = {"train": ("done", {"test_loss": 0.00399994, "test_accuracy": 0.9987}), "matmul": ("cancelled", {})}
    run_ids = {}
    for job, (status, metrics) in endings.items():
        run_ids[job] = new_run_id(job)
        recorder = store.create(run_ids[job], job, {"dataset": "mnist", "model": "mnist-cnn"}, {})
        for name, value in metrics.items():
            recorder.record(Metric(name, value, step=0))
        recorder.record(RunFinished(status=status))
    monkeypatch.setenv("COLUMNS", "80")

    assert cli.main(["runs"]) == 0  # capsys: standard output is not a terminal, as in `tpudash runs | cat`
    lines = capsys.readouterr().out.splitlines()

    assert len(lines) == 1 + len(endings)  # the header, then one line per run
    train = next(line for line in lines if run_ids["train"] in line)
    matmul = next(line for line in lines if run_ids["matmul"] in line)
    assert "test_loss=0.00399994" in train and "✓ done" in train
    assert "■ cancelled" in matmul
    assert lines[0].split() == ["run", "name", "started", "duration", "status", "MFU", "final", "metrics"]
