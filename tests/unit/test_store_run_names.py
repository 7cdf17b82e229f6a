"""A run's readable name: made from its job and the params that tell its runs apart, kept in run.json."""

from __future__ import annotations

import json

from jobs.events import RunFinished
from screens.history import HistoryScreen
from tpudash.cli import main as cli
from tpudash.runs.layout import RUN_FILE, new_run_id
from tpudash.runs.store import RunStore

MNIST = {"dataset": "mnist", "model": "mnist-cnn", "epochs": 2}
CIFAR = {"dataset": "cifar10", "model": "cifar-cnn", "epochs": 2}


def record(store: RunStore, job: str, params: dict, **create) -> str:
    run_id = new_run_id(job)
    store.create(run_id, job, params, {}, **create).record(RunFinished(status="done"))
    return run_id


def test_two_training_runs_are_told_apart_by_dataset_and_model_in_tpudash_runs(isolated_runs_dir, capsys):
    store = RunStore(isolated_runs_dir)
    mnist, cifar = record(store, "train", MNIST), record(store, "train", CIFAR)

    assert cli.main(["runs"]) == 0
    lines = capsys.readouterr().out.splitlines()

    assert "train mnist mnist-cnn" in next(line for line in lines if mnist in line)
    assert "train cifar10 cifar-cnn" in next(line for line in lines if cifar in line)
    assert json.loads((isolated_runs_dir / mnist / RUN_FILE).read_text())["name"] == "train mnist mnist-cnn"


def test_a_run_recorded_before_names_gets_one_made_the_same_way(isolated_runs_dir):
    store = RunStore(isolated_runs_dir)
    run_id = record(store, "train", CIFAR)
    path = isolated_runs_dir / run_id / RUN_FILE
    meta = json.loads(path.read_text())
    del meta["name"]
    path.write_text(json.dumps(meta))

    info = store.info(store.find(run_id))

    assert info.name == "train cifar10 cifar-cnn"
    assert info.problems == []


def test_a_given_name_is_kept_and_a_job_without_naming_params_is_named_by_itself(isolated_runs_dir):
    store = RunStore(isolated_runs_dir)
    named = record(store, "train", MNIST, name="baseline, lr 1e-3")
    matmul = record(store, "matmul", {"m": 128})
    users_own = record(store, "my-keras-fit", {"dataset": "mnist"})

    names = {info.run_id: info.name for info in store.list_runs()}

    assert names == {named: "baseline, lr 1e-3", matmul: "matmul", users_own: "my-keras-fit"}


def test_a_name_that_breaks_the_rule_is_dropped_named_and_made_again(isolated_runs_dir):
    store = RunStore(isolated_runs_dir)
    run_id = record(store, "train", MNIST)
    path = isolated_runs_dir / run_id / RUN_FILE
    path.write_text(json.dumps({**json.loads(path.read_text()), "name": ["not", "text"]}))

    info = store.info(store.find(run_id))

    assert info.name == "train mnist mnist-cnn"
    assert info.problems == [f"{RUN_FILE}: name must be text of at most 256 characters, not ['not', 'text']"]


def test_history_shows_the_runs_name(isolated_runs_dir):
    store = RunStore(isolated_runs_dir)
    record(store, "train", MNIST)
    screen = HistoryScreen.__new__(HistoryScreen)
    screen.runs = {info.run_id: info for info in store.list_runs()}
    screen.marked = set()

    (cells,) = screen._cells(narrow=False).values()

    assert "train mnist mnist-cnn" in cells


def test_tpudash_run_name_is_what_runs_lists_and_a_bad_name_is_refused_naming_the_flag(isolated_runs_dir, capsys):
    small = ["--set", "m=32", "--set", "k=32", "--set", "n=32", "--set", "repeats=1"]
    assert cli.main(["run", "matmul", *small, "--name", "  warm-up check  "]) == 0
    capsys.readouterr()

    assert cli.main(["run", "matmul", *small, "--name", "two\nlines"]) == 2
    refusal = capsys.readouterr().err

    assert cli.main(["runs"]) == 0
    listing = capsys.readouterr().out
    assert "--name must be text of 1 to 256 printable characters" in refusal and "'two\\nlines'" in refusal
    assert [info.name for info in RunStore(isolated_runs_dir).list_runs()] == ["warm-up check"]
    assert "warm-up check" in listing
