"""The headless CLI: subcommands, global flags anywhere, exit codes, no run dir for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT
from tpudash import cli


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
    return [path for path in runs_dir.iterdir() if path.is_dir() and not path.name.startswith(".")] if runs_dir.exists() else []


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
        (["run", "gradient-descent", "--set", "learning_rate=0"], "learning_rate: 0 is out of range; allowed: a number > 0"),
        (["run", "gradient-descent", "--set", "steps=many"], "steps: 'many' is not an integer"),
        (["run", "gradient-descent", "--set", "nope=1"], "nope: unknown param for job 'gradient-descent'"),
        (["run", "gradient-descent", "--set", "optimizer=rmsprop"], "optimizer: 'rmsprop' is not allowed; allowed: one of"),
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
    assert {"matmul", "replica-matmul", "replica-dataset", "all-reduce", "gradient-descent", "train", "dtensor-mlp"} <= set(jobs)
    assert jobs["matmul"]["key"] == "m" and jobs["gradient-descent"]["key"] == "g"
    learning_rate = next(param for param in jobs["gradient-descent"]["params"] if param["name"] == "learning_rate")
    assert learning_rate["default"] == "0.1"


def test_run_json_prints_one_event_per_line_then_runs_lists_and_exports_it(isolated_runs_dir, capsys):
    assert cli.main(["run", "gradient-descent", "--json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    events = [json.loads(line) for line in lines]
    assert events[0]["type"] == "run_started" and events[-1]["type"] == "run_finished"
    assert events[-1]["status"] == "done"
    assert any(event["type"] == "log" and event["text"] == "0.0022596875205636024 @ [0.01152921 0.04611686]"
               for event in events)
    run_id = events[0]["run_id"]
    assert cli.main(["runs", "--json"]) == 0
    [listed] = json.loads(capsys.readouterr().out)
    assert listed["run_id"] == run_id and listed["status"] == "done"
    output = isolated_runs_dir / "loss.csv"
    assert cli.main(["export", run_id[:20], "-o", str(output)]) == 0
    header, *rows = output.read_text().splitlines()
    assert header == "time,name,split,step,epoch,value"
    assert sum(1 for row in rows if ",loss," in row) == 20


def test_human_output_shows_the_result_and_exit_code_of_a_failed_check(capsys):
    assert cli.main(["run", "matmul", "--set", "m=4", "--set", "k=4", "--set", "n=4", "--set", "inject_error=1"]) == 1
    out = capsys.readouterr().out
    assert "failed" in out


def test_import_tpudash_loads_neither_tensorflow_nor_textual():
    code = "import sys, tpudash, tpudash.cli, tpudash.config; print(sorted(m for m in ('tensorflow', 'textual') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT)
    assert result.stdout.strip() == "[]", result.stderr


def test_jobs_never_import_textual_or_the_app():
    code = (
        "import sys, jobs; jobs.registry(); "
        "print(sorted(m for m in ('textual', 'screens', 'tpudash.app', 'tensorflow') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT)
    assert result.stdout.strip() == "[]", result.stderr


def test_the_dashboard_and_every_screen_import_no_tensorflow():
    from screens import MODE_SCREENS

    modules = ["tpudash.app", "tpudash.palette", "screens.dialogs"] + [module for module, *_ in MODE_SCREENS.values()]
    code = (f"import sys, importlib; [importlib.import_module(name) for name in {modules!r}]; "
            "print(sorted(m for m in ('tensorflow', 'keras', 'tensorflow_datasets') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT)
    assert result.stdout.strip() == "[]", result.stderr


def test_the_run_model_the_lane_the_engine_handle_and_the_writers_import_neither_textual_nor_tensorflow():
    code = ("import sys, tpudash.runmodel, tpudash.clock, tpudash.series, tpudash.lane, tpudash.engine, "
            "tpudash.follow, tpudash.recording; "
            "print(sorted(m for m in ('textual', 'tensorflow', 'screens', 'tpudash.app') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT)
    assert result.stdout.strip() == "[]", result.stderr


def test_the_keras_callback_imports_no_textual_and_no_screens():
    code = ("import sys, tpudash.callbacks; "
            "print(sorted(m for m in ('textual', 'screens', 'tpudash.app') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT)
    assert result.stdout.strip() == "[]", result.stderr
