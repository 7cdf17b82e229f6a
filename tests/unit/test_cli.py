"""The headless CLI: subcommands, global flags anywhere, exit codes, no run dir for bad input."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from jobs import get_job
from jobs.events import Metric, RunFinished
from tests.conftest import REPO_ROOT
from tpudash.cli import commands
from tpudash.cli import main as cli
from tpudash.runs.layout import new_run_id
from tpudash.runs.store import RunStore

# What a user's shell on this machine would not have: TPU settings, and the
# libtpu variables the test process sets for itself (tests/conftest.py).
USER_UNSET = ("TPU_NAME", "COLAB_TPU_ADDR", "TPU_LOAD_LIBRARY", "TPU_SKIP_MDS_QUERY")


def run_cli(*argv: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """The real console entry point in a fresh process, as a user runs it."""
    environment = {key: value for key, value in os.environ.items() if key not in USER_UNSET}
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "tpudash", *argv],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=environment,
        timeout=timeout,
    )


def run_dirs(runs_dir):
    return (
        [path for path in runs_dir.iterdir() if path.is_dir() and not path.name.startswith(".")]
        if runs_dir.exists()
        else []
    )


def test_devices_json_shows_eight_cpu_devices_and_why_not_tpu_or_gpu():
    result = run_cli("devices", "--json")
    assert result.returncode == 0, result.stderr
    description = json.loads(result.stdout)
    assert description["kind"] == "CPU"
    assert description["num_replicas"] == 8
    assert len(description["devices"]) == 8
    assert description["reasons"]["TPU"].startswith("no --tpu flag, no COLAB_TPU_ADDR or TPU_NAME")
    assert "no GPU" in description["reasons"]["GPU"]
    # TensorFlow's C++ start-up chatter goes to the session log, not the user's terminal.
    assert "oneDNN" not in result.stderr and "cuInit" not in result.stderr


def test_explicit_tpu_name_that_cannot_resolve_exits_2_with_the_resolvers_message():
    result = run_cli("devices", "--tpu", "no-such-tpu.invalid")
    assert result.returncode == 2
    assert "TPUClusterResolver(tpu='no-such-tpu.invalid') failed" in result.stderr
    assert "Traceback" not in result.stderr


def test_explicit_unreachable_tpu_address_exits_2_after_the_timeout():
    result = run_cli("--tpu", "grpc://127.0.0.1:9", "devices", env={"TPUDASH_TPU_TIMEOUT": "2"})
    assert result.returncode == 2
    assert "connecting to TPU grpc://127.0.0.1:9 did not answer within 2 s" in result.stderr


def test_global_flags_work_before_and_after_the_subcommand(isolated_runs_dir, tmp_path, capsys):
    other = tmp_path / "elsewhere"
    other.mkdir()
    assert cli.main(["runs", "--runs-dir", str(other)]) == 0
    assert str(other) in capsys.readouterr().out
    assert cli.main(["--runs-dir", str(other), "runs", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--cpu-devices", "0", "devices"], "--cpu-devices: 0 is out of range"),
        (["devices", "--cpu-devices", "lots"], "--cpu-devices: 'lots' is not an integer"),
        (["run", "no-such-job"], "unknown job 'no-such-job'; allowed: "),
        (
            ["run", "gradient-descent", "--set", "learning_rate=0"],
            "learning_rate: 0 is out of range; allowed: a number > 0",
        ),
        (["run", "gradient-descent", "--set", "steps=many"], "steps: 'many' is not an integer"),
        (["run", "gradient-descent", "--set", "nope=1"], "nope: unknown param for job 'gradient-descent'"),
        (
            ["run", "gradient-descent", "--set", "optimizer=rmsprop"],
            "optimizer: 'rmsprop' is not allowed; allowed: one of",
        ),
        (["run", "gradient-descent", "--set", "steps"], "steps: expected NAME=VALUE"),
        (["export", "no-such-run"], "no run 'no-such-run'"),
    ],
)
def test_bad_input_exits_2_with_the_field_named_and_no_run_directory(argv, message, isolated_runs_dir, capsys):
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert message in captured.err
    assert "Traceback" not in captured.err + captured.out
    assert run_dirs(isolated_runs_dir) == []


def test_argparse_errors_also_exit_2(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["export", "x", "--format", "xml"])
    assert exited.value.code == 2
    assert "invalid choice: 'xml'" in capsys.readouterr().err


def test_jobs_json_lists_every_job_with_params(capsys):
    assert cli.main(["jobs", "--json"]) == 0
    jobs = {job["name"]: job for job in json.loads(capsys.readouterr().out)}
    assert {
        "matmul",
        "replica-matmul",
        "replica-dataset",
        "all-reduce",
        "gradient-descent",
        "train",
        "dtensor-mlp",
    } <= set(jobs)
    assert jobs["matmul"]["key"] == "m" and jobs["gradient-descent"]["key"] == "g"
    learning_rate = next(param for param in jobs["gradient-descent"]["params"] if param["name"] == "learning_rate")
    assert learning_rate["default"] == "0.1"


def test_run_json_prints_one_event_per_line_then_runs_lists_and_exports_it(isolated_runs_dir, capsys):
    assert cli.main(["run", "gradient-descent", "--json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    events = [json.loads(line) for line in lines]
    assert events[0]["type"] == "run_started" and events[-1]["type"] == "run_finished"
    assert events[-1]["status"] == "done"
    assert any(
        event["type"] == "log" and event["text"] == "0.0022596875205636024 @ [0.01152921 0.04611686]"
        for event in events
    )
    run_id = events[0]["run_id"]
    assert cli.main(["runs", "--json"]) == 0
    [listed] = json.loads(capsys.readouterr().out)
    assert listed["run_id"] == run_id and listed["status"] == "done"
    output = isolated_runs_dir / "loss.csv"
    assert cli.main(["export", run_id[:20], "-o", str(output)]) == 0
    header, *rows = output.read_text().splitlines()
    assert header == "time,name,split,step,epoch,value"
    assert sum(1 for row in rows if ",loss," in row) == 21  # the start (step 0), then each of the 20 steps


def test_human_output_of_a_failed_check_shows_the_status_the_error_the_run_id_and_exits_1(isolated_runs_dir, capsys):
    code = cli.main(["run", "matmul", "--set", "m=4", "--set", "k=4", "--set", "n=4", "--set", "inject_error=1"])
    out = capsys.readouterr().out
    assert code == 1
    [run_dir] = run_dirs(isolated_runs_dir)
    run_id = run_dir.name
    # The run named at the start is the one on disk, recorded failed with the error the user read.
    assert f"run {run_id}" in out
    info = RunStore(isolated_runs_dir).info(run_dir)
    assert info.status == "failed" and info.error == "CheckFailed: matmul check failed on /device:CPU:0"
    lines = [line.strip() for line in out.splitlines()]
    assert "✗ failed" in lines
    assert "error: CheckFailed: matmul check failed on /device:CPU:0" in lines
    # Which device failed, in the results table, and that the others passed.
    rows = {line.split()[1]: line for line in out.splitlines() if re.match(r"│ CPU:\d", line)}
    assert sorted(rows) == [f"CPU:{index}" for index in range(8)]
    assert "FAIL" in rows["CPU:0"] and all("pass" in rows[f"CPU:{index}"] for index in range(1, 8))
    assert "Traceback" not in out


def test_import_tpudash_loads_neither_tensorflow_nor_textual():
    code = "import sys, tpudash, tpudash.cli.main, tpudash.config; print(sorted(m for m in ('tensorflow', 'textual') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT)
    assert result.stdout.strip() == "[]", result.stderr


def test_jobs_never_import_textual_or_the_app():
    code = (
        "import sys, jobs; jobs.registry(); "
        "print(sorted(m for m in ('textual', 'screens', 'tpudash.tui.app', 'tensorflow') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT)
    assert result.stdout.strip() == "[]", result.stderr


def test_the_dashboard_and_every_screen_import_no_tensorflow():
    from tpudash.tui.modes import MODE_SCREENS

    modules = ["tpudash.tui.app", "tpudash.tui.palette", "tpudash.tui.dialogs"] + [
        module for module, *_ in MODE_SCREENS.values()
    ]
    code = (
        f"import sys, importlib; [importlib.import_module(name) for name in {modules!r}]; "
        "print(sorted(m for m in ('tensorflow', 'keras', 'tensorflow_datasets') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT)
    assert result.stdout.strip() == "[]", result.stderr


def test_the_run_model_the_lane_the_engine_handle_and_the_writers_import_neither_textual_nor_tensorflow():
    code = (
        "import sys, tpudash.runs.model, tpudash.format, tpudash.runs.series, tpudash.engine.lane, tpudash.engine.handle, "
        "tpudash.runs.follow, tpudash.recording; "
        "print(sorted(m for m in ('textual', 'tensorflow', 'screens', 'tpudash.tui.app') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT)
    assert result.stdout.strip() == "[]", result.stderr


def test_the_keras_callback_imports_no_textual_and_no_screens():
    code = (
        "import sys, tpudash.callbacks; "
        "print(sorted(m for m in ('textual', 'screens', 'tpudash.tui.app') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT)
    assert result.stdout.strip() == "[]", result.stderr


# -- the dashboard needs a terminal ----------------------------------------------------------

# Started anyway, the dashboard would run until killed; this bounds the test.
NO_TERMINAL_TIMEOUT = 30
COLAB_VARIABLES = ("COLAB_RELEASE_TAG", "COLAB_GPU", "COLAB_TPU_ADDR")


@pytest.mark.parametrize("output", ["file", "pipe", "closed-pipe"])
def test_the_dashboard_without_a_terminal_exits_2_at_once_pointing_to_the_headless_commands(output, tmp_path):
    """A notebook cell's `!tpudash`, `tpudash > file`, `tpudash | head`: a message, never escape codes."""
    environment = {key: value for key, value in os.environ.items() if key not in USER_UNSET + COLAB_VARIABLES}
    output_file = tmp_path / "out.txt"
    if output == "file":
        stdout = open(output_file, "w")
    elif output == "pipe":
        stdout = subprocess.PIPE
    else:
        reader, stdout = os.pipe()
        os.close(reader)  # the reader went away before tpudash wrote anything
    started = time.monotonic()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "tpudash"],
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
            env=environment,
            timeout=NO_TERMINAL_TIMEOUT,
        )
    finally:
        if output == "file":
            stdout.close()
        elif output == "closed-pipe":
            os.close(stdout)
    elapsed = time.monotonic() - started

    assert result.returncode == 2, result.stderr
    assert elapsed < 10
    assert result.stderr.startswith(
        "tpudash: error: the dashboard needs a terminal, and standard input, "
        "standard output and standard error are not one"
    )
    for command in ("tpudash devices", "tpudash run JOB", "tpudash runs", "tpudash watch", "tpudash telemetry"):
        assert command in result.stderr
    assert "Colab" not in result.stderr
    assert (result.stdout or "") == ""
    if output == "file":
        assert output_file.read_text() == ""


def test_on_colab_the_no_terminal_message_points_to_colabs_terminal(monkeypatch, capsys):
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab_20261120-060000_RC00")
    monkeypatch.setattr(
        commands, "command_tui", lambda settings: pytest.fail("the dashboard started without a terminal")
    )
    assert cli.main([]) == 2
    captured = capsys.readouterr()
    assert "On Colab, open its terminal" in captured.err and "run tpudash there" in captured.err
    assert "from tpudash import colab; colab.show()" in captured.err
    assert captured.out == ""


def test_a_dashboard_served_to_a_browser_tab_starts_on_its_pipes(monkeypatch):
    # textual-serve starts every tab's dashboard under Textual's web driver, on pipes.
    monkeypatch.setenv("TEXTUAL_DRIVER", "textual.drivers.web_driver:WebDriver")
    started = []
    monkeypatch.setattr(commands, "command_tui", lambda settings: started.append(settings) or 0)
    assert cli.main([]) == 0 and len(started) == 1


def test_without_a_terminal_the_dashboard_exits_before_textual_or_tensorflow_is_imported():
    code = (
        "import sys; from tpudash.cli.main import main; code = main([]); "
        "print(code, sorted(m for m in ('textual', 'tensorflow', 'tpudash.tui.app') if m in sys.modules), "
        "file=sys.stderr)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=NO_TERMINAL_TIMEOUT,
    )
    assert result.stderr.splitlines()[-1] == "2 []", result.stderr


# -- 80 columns ----------------------------------------------------------------------------


def test_runs_at_80_columns_shows_every_run_id_whole(isolated_runs_dir, monkeypatch, capsys):
    store = RunStore(isolated_runs_dir)
    finals = {
        "gradient-descent": {"loss": 0.0022596875205636024},
        "replica-matmul": {},
        "train": {"loss": 0.31, "accuracy": 0.91, "val_loss": 0.42, "val_accuracy": 0.88},
    }
    run_ids = []
    for job, metrics in finals.items():
        run_ids.append(new_run_id(job))
        recorder = store.create(run_ids[-1], job, {}, {"kind": "CPU"})
        for name, value in metrics.items():
            recorder.record(Metric(name, value, step=0))
        recorder.record(RunFinished(status="done"))
    monkeypatch.setenv("COLUMNS", "80")
    # A terminal 80 columns wide, without colour codes to measure around (a pipe gets one line per run).
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("TERM", "dumb")

    assert cli.main(["runs"]) == 0
    out = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)
    # the terminal's table, titled (a runs directory's path longer than the line goes on to the next)
    assert re.sub(r"\s+", "", out).startswith(f"runsin{isolated_runs_dir}")

    assert max(len(line) for line in out.splitlines()) <= 80
    assert "…" not in out
    for run_id in run_ids:
        assert run_id in out
    assert "val_accuracy=0.88" in out


def test_the_matmul_table_at_80_columns_names_each_device_briefly_and_distinctly(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    # A terminal 80 columns wide, without colour codes (into a pipe, lines are as long as they need).
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("TERM", "dumb")
    assert cli.main(["run", "matmul", "--set", "m=32", "--set", "k=32", "--set", "n=32", "--set", "repeats=1"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if re.match(r"│ CPU:\d ", line)]
    assert [row.split()[1] for row in rows] == [f"CPU:{index}" for index in range(8)]
    assert all(len(line) <= 80 for line in out.splitlines())
    assert "/device:…" not in out


# -- each fact once ------------------------------------------------------------------------


def test_headless_matmul_prints_each_devices_result_once_and_no_python_dicts(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    assert cli.main(["run", "matmul", "--set", "m=32", "--set", "k=32", "--set", "n=32", "--set", "devices=0-3"]) == 0
    out = capsys.readouterr().out

    for index in range(4):
        # Its table row; the summary's fastest/slowest device and the closing line name a device, not a result.
        mentions = [
            line
            for line in out.splitlines()
            if re.search(rf"\bCPU:{index}\b", line) and not re.search("fastest|slowest", line)
        ]
        assert len(mentions) == 1, mentions
        assert "pass" in mentions[0]
    assert "{'" not in out and "':" not in out
    assert "✓ done" in out


# -- help, and the mistakes users make -------------------------------------------------------


def test_run_job_help_lists_that_jobs_params_with_defaults_and_what_is_allowed(capsys):
    assert cli.main(["run", "train", "--help"]) == 0
    out = capsys.readouterr().out
    assert "usage: tpudash run" in out
    for param in get_job("train").params:
        assert f"--set {param.name}={param.format(param.default)}" in out
    compact = " ".join(out.split())  # rich wraps the descriptions to the terminal
    assert "--set epochs=5 an integer >= 1 and <= 100000. passes over the training split" in compact
    assert "one of float32, mixed_bfloat16, mixed_float16" in compact
    assert "--set deterministic=false true/false, yes/no, on/off, 1/0 (any case)." in compact
    assert "Booleans: true/false, yes/no, on/off, 1/0 (any case)." in compact


def test_run_help_without_a_job_lists_the_jobs_and_run_without_one_is_still_an_error(capsys):
    assert cli.main(["run", "--help"]) == 0
    assert "jobs: matmul, replica-matmul" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exited:
        cli.main(["run"])
    assert exited.value.code == 2
    assert "the following arguments are required: job" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (["run", "matmull"], ["unknown job 'matmull'; allowed: matmul, ", "; did you mean 'matmul'?"]),
        (["run", "grad-descent", "--help"], ["unknown job 'grad-descent'", "; did you mean 'gradient-descent'?"]),
        (
            ["run", "gradient-descent", "--set", "lerning_rate=0.1"],
            ["lerning_rate: unknown param for job 'gradient-descent'", "; did you mean 'learning_rate'?"],
        ),
        (
            ["run", "train", "--set", "deterministic=y"],
            ["deterministic: 'y' is not true/false, yes/no, on/off, 1/0 (any case)"],
        ),
    ],
)
def test_a_mistyped_job_or_param_name_gets_a_suggestion(argv, fragments, isolated_runs_dir, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    for fragment in fragments:
        assert fragment in err
    assert run_dirs(isolated_runs_dir) == []


def test_runs_on_a_directory_that_does_not_exist_says_so_and_how_it_was_chosen(tmp_path, monkeypatch, capsys):
    missing = tmp_path / "no-such-runs"
    assert cli.main(["runs", "--runs-dir", str(missing)]) == 2
    captured = capsys.readouterr()
    assert captured.err == (
        f"tpudash: error: --runs-dir: {missing} does not exist, so it holds no runs; choose the "
        "runs directory with --runs-dir DIR or TPUDASH_RUNS_DIR (default "
        "$XDG_DATA_HOME/tpudash/runs; a run creates it)\n"
    )
    assert captured.out == ""
    monkeypatch.setenv("TPUDASH_RUNS_DIR", str(missing))
    assert cli.main(["runs", "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"tpudash: error: TPUDASH_RUNS_DIR: {missing} does not exist")
    assert captured.out == ""
    assert not missing.exists()

    missing.mkdir()  # empty, but there: nothing to list, no error
    assert cli.main(["runs", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert cli.main(["runs"]) == 0
    assert f"no runs yet in {missing}" in " ".join(capsys.readouterr().out.split())


def test_watch_ends_a_run_whose_writer_died_with_the_interrupted_glyph(isolated_runs_dir, monkeypatch, capsys):
    import tpudash.runs.liveness

    run_id = new_run_id("fit")
    recorder = RunStore(isolated_runs_dir).create(run_id, "fit", {}, {"kind": "CPU"})
    recorder.record(Metric("loss", 0.5, step=0))
    recorder.close()  # no finish: as if its process had been killed
    monkeypatch.setattr(tpudash.runs.liveness, "process_alive", lambda pid, *start, **ticks: False)

    assert cli.main(["watch", run_id, "--telemetry-interval", "0"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert f"! interrupted: pid {os.getpid()} ended without finishing {run_id}" in out
