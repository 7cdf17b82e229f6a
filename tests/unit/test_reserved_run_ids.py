"""The runs directory's reserved folder (``hosts/``, the host agents' reports) is never taken for a run.

Issue 38, item 8: ``tpudash run matmul --run-id hosts`` wrote into the
agents' folder (which ``tpudash runs`` then never listed), and ``tpudash copy
hosts DEST`` copied the agents' folder as a run. Every entrance that takes a
run id refuses it: ``--run-id``, ``run_id=`` and ``TPUDASH_RUN_ID`` of
``tpudash.record`` and ``TpudashCallback``, ``tpudash copy`` (by id or by
path), and the store's ``create`` and ``join``.
"""

from __future__ import annotations

import json

import pytest

from tpudash.cli import main as cli
from tpudash.recording import RecordedRun, RecordingError, shared_run_id
from tpudash.runs.backends import RESERVED_FOLDERS
from tpudash.runs.layout import RUN_ID_RULE, is_run_id
from tpudash.runs.store import RunStore
from tpudash.runs.workers import WorkerIdentity

SMALL_MATMUL = ["--set", "m=8", "--set", "k=8", "--set", "n=8", "--set", "repeats=1"]


def agents_folder(runs_dir) -> None:
    """``hosts/<name>/host.json``, as ``tpudash agent`` leaves it."""
    host = runs_dir / "hosts" / "tpu-vm-0"
    host.mkdir(parents=True)
    (host / "host.json").write_text(json.dumps({"heartbeat": 1.0, "interval": 5.0, "host": "tpu-vm-0"}))


@pytest.mark.parametrize("run_id", ["hosts", "HOSTS", "Hosts"])
def test_run_with_run_id_hosts_is_bad_input_naming_the_flag_and_writes_nothing(isolated_runs_dir, capsys, run_id):
    assert cli.main(["run", "matmul", *SMALL_MATMUL, "--run-id", run_id]) == 2

    refusal = capsys.readouterr().err
    assert f"--run-id: {run_id!r} is reserved" in refusal
    assert "host agents' reports" in refusal and "allowed: a plain name" in refusal and "not 'hosts'" in refusal
    assert not (isolated_runs_dir / run_id).exists()


def test_copy_hosts_is_refused_by_id_and_by_path_and_copies_nothing(isolated_runs_dir, tmp_path, capsys, monkeypatch):
    agents_folder(isolated_runs_dir)
    destination = tmp_path / "dest"

    assert cli.main(["copy", "hosts", str(destination)]) == 2
    by_id = capsys.readouterr().err
    assert cli.main(["copy", str(isolated_runs_dir / "hosts"), str(destination)]) == 2
    by_path = capsys.readouterr().err
    monkeypatch.chdir(isolated_runs_dir)  # ``hosts`` is then also a directory here, named without its path
    assert cli.main(["copy", "hosts", str(destination)]) == 2
    from_inside = capsys.readouterr().err

    for refusal in (by_id, by_path, from_inside):
        assert refusal.startswith("tpudash: error: RUN: ") and "'hosts' is" in refusal
        assert "that folder holds the host agents' reports" in refusal
    assert not (destination / "hosts").exists()


def test_copy_all_leaves_the_agents_folder_behind(isolated_runs_dir, tmp_path):
    agents_folder(isolated_runs_dir)
    store = RunStore(isolated_runs_dir)
    run = store.create("20260101-000000-fit-abcdef", "fit", {}, {})
    run.close()

    assert cli.main(["copy", "--all", str(tmp_path / "dest")]) == 0

    assert sorted(path.name for path in (tmp_path / "dest").iterdir()) == ["20260101-000000-fit-abcdef"]


@pytest.mark.parametrize("run_id", ["hosts", "HoStS"])
def test_the_store_creates_and_joins_no_run_called_hosts(tmp_path, run_id):
    store = RunStore(tmp_path / "runs")

    with pytest.raises(ValueError, match=rf"run_id: '{run_id}' is reserved; allowed: a run id is"):
        store.create(run_id, "fit", {}, {})
    with pytest.raises(ValueError, match=rf"run_id: '{run_id}' is reserved"):
        store.join(run_id, "fit", {}, {}, worker=WorkerIdentity(index=1, count=2, task="worker", host="127.0.0.1:2223"))
    assert not (tmp_path / "runs" / run_id).exists()


def test_the_store_creates_no_run_in_a_store_called_hosts():
    bucket = RunStore("memory://reserved-names/runs")

    with pytest.raises(ValueError, match="run_id: 'hosts' is reserved"):
        bucket.create("hosts", "fit", {}, {})
    assert bucket.files("hosts").walk() == {}


@pytest.mark.parametrize("where", ["argument", "variable"])
def test_record_and_the_callback_refuse_run_id_hosts_naming_where_it_came_from(monkeypatch, where):
    if where == "variable":
        monkeypatch.setenv("TPUDASH_RUN_ID", " hosts ")
        given, field = None, "TPUDASH_RUN_ID"
    else:
        monkeypatch.delenv("TPUDASH_RUN_ID", raising=False)
        given, field = "hosts", "run_id"

    with pytest.raises(RecordingError) as refusal:
        shared_run_id(given, None)

    assert str(refusal.value).startswith(f"{field}: 'hosts' is not allowed; allowed: {RUN_ID_RULE}")
    assert "not 'hosts'" in RUN_ID_RULE


def test_tpudash_record_refuses_run_id_hosts_before_anything_is_written(isolated_runs_dir):
    with pytest.raises(RecordingError, match="run_id: 'hosts' is not allowed"):
        RecordedRun("my loop", runtime={}, run_id="hosts")  # what tpudash.record makes, TensorFlow left out
    assert not (isolated_runs_dir / "hosts").exists()


def test_every_reserved_folder_is_no_run_id_in_any_case():
    assert RESERVED_FOLDERS == {"hosts"}
    for name in RESERVED_FOLDERS:
        assert not is_run_id(name) and not is_run_id(name.upper()) and not is_run_id(name.title())
    assert is_run_id("hosts-0") and is_run_id("my-hosts") and is_run_id("20260101-000000-hosts-abcdef")
