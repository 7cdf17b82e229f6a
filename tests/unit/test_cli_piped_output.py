"""What the headless commands print into a pipe or a file (`tpudash … | cat`), and how the command line helps.

Under capsys standard output is not a terminal, exactly as in `tpudash run … | cat`: every line is as
long as what it says (a TensorBoard path whole, "on TensorFlow 2.21.0" on one line), no line ends in
padding, and one series of numbers reads in one format. `tpudash runs` lists newest first as History
does; a mistyped command gets the nearest ones; each command's --help lists the flags it uses.
"""

from __future__ import annotations

import json
import re

import pytest

from jobs.events import Artifact, Metric, Progress, RunFinished, RunStarted
from tpudash.cli import main as cli
from tpudash.format import format_reading
from tpudash.runs.store import RunStore

RUNTIME = {
    "backend": "tensorflow",
    "tensorflow": "2.21.0",
    "kind": "CPU",
    "device_count": 8,
    "simulated": True,
    "strategy": "MirroredStrategy",
    "num_replicas": 8,
    "keras": "3.15.1",
}


def recorded_training(store: RunStore, run_id: str, tensorboard: str, examples_per_second: list[float]) -> None:
    """A finished training run as ``tpudash run train`` records it: its start, epochs, TensorBoard path, summary."""
    recorder = store.create(run_id, "train", {"dataset": "mnist"}, RUNTIME)
    recorder.record(RunStarted(run_id, "train", {"dataset": "mnist"}, RUNTIME, recorder.meta["started"]))
    recorder.record(Artifact("tensorboard", tensorboard))
    epochs = len(examples_per_second)
    for epoch, speed in enumerate(examples_per_second, 1):
        recorder.record(Metric("loss", 2.5 / epoch, step=epoch * 10, epoch=epoch))
        recorder.record(Metric("examples_per_second", speed, step=epoch * 10, epoch=epoch))
        recorder.record(Progress(epoch, epochs, "epoch"))
    summary = {"examples_per_second": examples_per_second[-1], "tensorboard": tensorboard, "loss": 2.5 / epochs}
    recorder.record(RunFinished(status="done", summary=summary))


@pytest.fixture
def long_tensorboard_path(isolated_runs_dir) -> str:
    return str(isolated_runs_dir / "a-runs-directory-deep-enough-for-its-paths-to-pass-80-columns" / "tensorboard")


def test_a_piped_run_prints_its_tensorboard_path_whole_and_no_line_wrapped_or_padded(
    isolated_runs_dir, long_tensorboard_path, monkeypatch, capsys
):
    run_id = "20261128-010000-train-a1b2c3"
    recorded_training(RunStore(isolated_runs_dir), run_id, long_tensorboard_path, [6042.3, 6100.2])
    monkeypatch.setenv("COLUMNS", "80")

    assert cli.main(["watch", run_id]) == 0  # `tpudash watch RUN | cat`: the sink `tpudash run` prints with
    lines = capsys.readouterr().out.splitlines()

    assert len(long_tensorboard_path) > 80
    summary_row = next(line for line in lines if line.lstrip("│ ").startswith("tensorboard "))
    assert long_tensorboard_path in summary_row  # whole, not "/tmp/…/a-runs-dir…"
    assert f"tensorboard: {long_tensorboard_path}" in lines
    assert lines[0].startswith(f"▶ train  run {run_id}  on TensorFlow 2.21.0 · ")
    assert lines[0].endswith("· Keras 3.15.1")  # the runtime on one line, not "on TensorFlow ⏎2.21.0"
    assert [line for line in lines if line != line.rstrip()] == []


def test_jobs_into_a_pipe_keeps_each_description_and_param_on_one_line_without_trailing_spaces(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")

    assert cli.main(["jobs"]) == 0
    lines = capsys.readouterr().out.splitlines()

    assert [line for line in lines if line != line.rstrip()] == []
    description = next(line for line in lines if "Every logical device multiplies" in line)
    assert "A wrong device fails the run." in description
    inject = next(line for line in lines if "--set inject_error=" in line)
    assert inject.endswith("must make inject_device fail")


def test_watch_prints_one_series_of_numbers_in_one_format(isolated_runs_dir, long_tensorboard_path, capsys):
    run_id = "20261128-010000-train-d4e5f6"
    recorded_training(RunStore(isolated_runs_dir), run_id, long_tensorboard_path, [6042.3, 14080.4, 9876.5])

    assert cli.main(["watch", run_id]) == 0
    epochs = [line for line in capsys.readouterr().out.splitlines() if line.startswith("epoch ")]

    speeds = [re.search(r"examples_per_second (\S+)", line).group(1) for line in epochs]
    assert speeds == ["6042", "14080", "9876"]  # not 6042, 1.408e+04, 9876


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (14080.4, "14080"),
        (6042.3, "6042"),
        (2.302585, "2.303"),
        (0.09375, "0.09375"),
        (0.00005, "0.00005"),
        (123456789.0, "123456789"),
        (-14080.4, "-14080"),
        (0.0, "0"),
        (1e20, "1e+20"),
        (float("nan"), "nan"),
    ],
)
def test_a_live_metric_has_four_significant_digits_and_no_exponent_in_the_range_training_moves_in(value, shown):
    assert format_reading(value) == shown


# -- tpudash runs: newest first ----------------------------------------------------------------


def three_runs(runs_dir) -> list[str]:
    """Three finished runs, oldest first (by their ids' times and by their starts)."""
    store = RunStore(runs_dir)
    run_ids = ["20260101-090000-matmul-aaaaaa", "20260102-090000-train-bbbbbb", "20260103-090000-matmul-cccccc"]
    for run_id in run_ids:
        store.create(run_id, run_id.split("-")[2], {}, {}).record(RunFinished(status="done"))
    return run_ids


def test_runs_lists_the_newest_first_as_history_does(isolated_runs_dir, capsys):
    oldest_first = three_runs(isolated_runs_dir)

    assert cli.main(["runs"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]]

    assert listed == oldest_first[::-1]


def test_runs_json_is_in_the_same_order_and_the_help_says_so(isolated_runs_dir, capsys):
    oldest_first = three_runs(isolated_runs_dir)

    assert cli.main(["runs", "--json"]) == 0
    assert [run["run_id"] for run in json.loads(capsys.readouterr().out)] == oldest_first[::-1]
    with pytest.raises(SystemExit):
        cli.main(["runs", "--help"])
    assert "newest first" in " ".join(capsys.readouterr().out.split())


# -- a mistyped command ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("typed", "suggestion"),
    [
        ("runz", "did you mean 'runs' or 'run'?"),
        ("wtach", "did you mean 'watch'?"),
        ("devcies", "did you mean 'devices'?"),
    ],
)
def test_a_mistyped_command_gets_the_nearest_ones_and_exits_2(typed, suggestion, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main([typed])

    assert exited.value.code == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.startswith(f"tpudash: error: argument COMMAND: invalid choice: '{typed}'")
    assert error.endswith(suggestion)


def test_a_command_nothing_is_near_gets_no_guess(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["xyzzy"])
    assert exited.value.code == 2
    assert "did you mean" not in capsys.readouterr().err


# -- each command's --help ---------------------------------------------------------------------

FLAG_OPTIONS = {name: f"--{name.replace('_', '-')}" for name in cli.GLOBAL_FLAGS + cli.DASHBOARD_FLAGS}


def help_of(command: str, capsys) -> str:
    """``tpudash COMMAND --help``'s text (argparse exits; ``run --help`` returns, the job list after its help)."""
    try:
        code = cli.main([command, "--help"])
    except SystemExit as exited:
        code = exited.code
    assert code == 0
    return capsys.readouterr().out


def flags_listed(help_text: str) -> set[str]:
    return {name for name, option in FLAG_OPTIONS.items() if re.search(rf"{option}(?![\w-])", help_text)}


def test_a_commands_help_lists_only_the_session_flags_it_uses(capsys):
    runs_dir = {"runs_dir"} | {"store_timeout"} & set(FLAG_OPTIONS)  # a store's time to answer, where there is one
    assert flags_listed(help_of("jobs", capsys)) == set()
    assert flags_listed(help_of("runs", capsys)) == runs_dir
    assert flags_listed(help_of("export", capsys)) == runs_dir
    assert flags_listed(help_of("devices", capsys)) == {"tpu", "cpu_devices", "framework"}
    assert flags_listed(help_of("telemetry", capsys)) == {"tpu_metrics", "telemetry_interval"}
    assert flags_listed(help_of("run", capsys)) == set(cli.GLOBAL_FLAGS)  # not the dashboard's own
    assert flags_listed(help_of("serve", capsys)) == set(FLAG_OPTIONS)  # each tab is a dashboard


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_every_commands_help_lists_the_flags_it_uses_and_no_dashboard_flag_unless_it_serves(command, capsys):
    listed = flags_listed(help_of(command, capsys))

    assert listed == set(cli.FLAGS_USED[command]) & set(FLAG_OPTIONS)
    assert ("release_after" in listed) == (command == "serve")


def test_the_dashboards_own_help_still_lists_every_flag(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert flags_listed(capsys.readouterr().out) == set(FLAG_OPTIONS)


def test_a_flag_a_commands_help_leaves_out_is_still_accepted_after_it(isolated_runs_dir, capsys):
    isolated_runs_dir.mkdir()
    assert cli.main(["runs", "--cancel-grace", "3", "--cpu-devices", "4"]) == 0
    assert "no runs yet" in capsys.readouterr().out


def test_a_piped_tpudash_run_says_what_it_ran_on_in_one_unpadded_line(isolated_runs_dir, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")

    assert cli.main(["run", "gradient-descent"]) == 0  # `tpudash run gradient-descent | cat`
    lines = capsys.readouterr().out.splitlines()

    assert len(lines[0]) > 80  # what would have been wrapped
    assert re.fullmatch(r"▶ gradient-descent  run \S+  on TensorFlow \S+ · .* · Keras \S+", lines[0])
    assert [line for line in lines if line != line.rstrip()] == []
