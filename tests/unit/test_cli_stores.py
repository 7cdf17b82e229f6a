"""The command line with the runs directory in a store: ``run``, ``runs``, ``export``, ``watch`` and ``copy``.

Driven in-process (``tpudash.cli.main.main``) against ``memory://`` stores,
which behave as a bucket (no append, objects replaced whole) in this
process's memory; the loopback emulators are tests/object_stores.py's.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
import time
import uuid

import pytest

from jobs.events import Metric, RunStarted
from tests.conftest import REPO_ROOT
from tpudash.cli import main as cli
from tpudash.runs.layout import new_run_id
from tpudash.runs.liveness import WRITERS_FOLDER
from tpudash.runs.store import RunStore
from tpudash.runs.uploader import StoreRecorder

pytest_plugins = ["tests.object_stores"]  # gcs_store, s3_store: loopback emulators

# What `tpudash run gradient-descent` prints (tests/unit/test_cli.py, the README).
GRADIENT_DESCENT_FIGURE = "0.0022596875205636024 @ [0.01152921 0.04611686]"


def memory_url() -> str:
    """A store no other test shares (fsspec's memory filesystem is process-wide)."""
    return f"memory://cli-{uuid.uuid4().hex[:8]}/tpudash/runs"


def one_line(text: str) -> str:
    return " ".join(text.split())


def test_a_job_run_into_a_store_prints_its_figure_lists_done_exports_and_copies_home(tmp_path, capsys):
    url, home = memory_url(), tmp_path / "home-runs"

    assert cli.main(["run", "gradient-descent", "--json", "--runs-dir", url]) == 0
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert GRADIENT_DESCENT_FIGURE in [event.get("text") for event in events]
    run_id = events[0]["run_id"]

    assert cli.main(["runs", "--json", "--runs-dir", url]) == 0
    [listed] = json.loads(capsys.readouterr().out)
    assert (listed["run_id"], listed["status"], listed["path"]) == (run_id, "done", f"{url}/{run_id}")

    assert cli.main(["export", run_id[:20], "--runs-dir", url]) == 0
    assert sum(1 for row in capsys.readouterr().out.splitlines() if ",loss," in row) == 21

    assert cli.main(["copy", run_id[:20], str(home), "--runs-dir", url]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"copied {run_id} to {home / run_id}: ") and line.endswith(" KiB")
    assert cli.main(["--runs-dir", url, "copy", run_id, str(home)]) == 0
    assert capsys.readouterr().out.strip() == f"{run_id}: already there, in {home / run_id}"

    assert cli.main(["runs", "--json", "--runs-dir", str(home)]) == 0
    [at_home] = json.loads(capsys.readouterr().out)
    assert (at_home["status"], at_home["final_metrics"]) == ("done", listed["final_metrics"])


def test_runs_of_an_empty_store_says_there_are_none_yet(capsys):
    url = memory_url()
    assert cli.main(["runs", "--runs-dir", url]) == 0
    assert one_line(capsys.readouterr().out) == f"no runs yet in {url}"
    assert cli.main(["runs", "--json", "--runs-dir", url]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_copy_all_puts_every_local_run_into_a_store_and_a_spill_directory_is_named_by_its_path(
    isolated_runs_dir, tmp_path, capsys
):
    local = RunStore(isolated_runs_dir)
    run_ids = sorted(new_run_id("fit") for _ in range(2))
    for run_id in run_ids:
        recorder = local.create(run_id, "fit", {}, {})
        recorder.record(Metric("loss", 0.5, step=0))
        recorder.close()
    url = memory_url()

    assert cli.main(["copy", "--all", url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines] == run_ids
    assert all(line.startswith("copied ") for line in lines)
    assert {run.run_id: run.status for run in RunStore(url).list_runs()} == dict.fromkeys(run_ids, "interrupted")

    # A run directory named by its path (as the line about a store's leftovers names a spill directory).
    assert cli.main(["copy", str(isolated_runs_dir / run_ids[0]), url]) == 0
    assert capsys.readouterr().out.strip() == f"{run_ids[0]}: already there, in {url}/{run_ids[0]}"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["runs", "--runs-dir", "ftp://host/runs"],
            "--runs-dir: 'ftp://host/runs': the scheme 'ftp://' is not supported",
        ),
        (["copy", "--all", "ftp://host/runs"], "DEST: 'ftp://host/runs': the scheme 'ftp://' is not supported"),
        (["copy", "--all", "gs:///runs"], "DEST: 'gs:///runs': names no bucket"),
        (
            ["runs", "--runs-dir", "gcs://bucket/runs"],
            "--runs-dir: 'gcs://bucket/runs': the scheme 'gcs://' is not supported (did you mean gs://bucket/runs?)",
        ),
        (
            ["runs", "--runs-dir", "gs//bucket/runs"],
            "--runs-dir: 'gs//bucket/runs': reads as a store URL missing its colon: did you mean gs://bucket/runs?",
        ),
        (
            ["watch", "--runs-dir", "gs:/bucket/runs"],
            "--runs-dir: 'gs:/bucket/runs': reads as a store URL missing a slash: did you mean gs://bucket/runs?",
        ),
        (
            ["copy", "--all", "s3//bucket/runs"],
            "DEST: 's3//bucket/runs': reads as a store URL missing its colon: did you mean s3://bucket/runs?",
        ),
        (["copy", "20260101-000000-fit-abcdef", "/tmp/elsewhere"], "RUN: no run '20260101-000000-fit-abcdef' in "),
        (["copy", "/tmp"], "RUN: name the runs to copy"),
    ],
)
def test_bad_input_to_the_store_commands_exits_2_naming_the_argument(argv, message, capsys):
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"tpudash: error: {message}") and captured.out == ""


@pytest.fixture
def without_store_libraries(monkeypatch):
    """gcsfs and s3fs as if not installed (everything else is found as before)."""
    import tpudash.runs.location

    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        return None if name in ("gcsfs", "s3fs") else real(name, *args, **kwargs)

    monkeypatch.setattr(tpudash.runs.location.importlib.util, "find_spec", find_spec)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["runs", "--runs-dir", "gs://bucket/runs"],
            "--runs-dir / TPUDASH_RUNS_DIR: gs://bucket/runs needs a library not installed here: "
            "pip install 'tpudash[gcs]'",
        ),
        (["watch", "--runs-dir", "s3://bucket/runs"], "pip install 'tpudash[s3]'"),
        (["export", "RUN", "--runs-dir", "s3://bucket/runs"], "pip install 'tpudash[s3]'"),
        (["run", "gradient-descent", "--runs-dir", "gs://bucket/runs"], "pip install 'tpudash[gcs]'"),
        (
            ["copy", "--all", "s3://bucket/runs"],
            "DEST: s3://bucket/runs needs a library not installed here: pip install 'tpudash[s3]'",
        ),
    ],
)
def test_a_store_whose_library_is_missing_exits_2_with_the_install_line(argv, message, without_store_libraries, capsys):
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.err.count("\n") == 1 and captured.out == ""


def test_a_store_that_does_not_answer_is_one_line_and_exit_1(monkeypatch, tmp_path, capsys):
    def refused(self):
        raise ConnectionError("Cannot connect to host 127.0.0.1:9 ssl:default [Connection refused]")

    monkeypatch.setattr(RunStore, "run_ids", refused)
    url = memory_url()
    for argv in (["runs"], ["watch"], ["copy", "--all", str(tmp_path / "copies")]):
        assert cli.main([*argv, "--runs-dir", url]) == 1
        assert capsys.readouterr().err == f"tpudash: error: cannot reach {url}: connection refused by 127.0.0.1:9\n"


@pytest.mark.parametrize("store_fixture", ["gcs_store", "s3_store"])
def test_a_stopped_emulator_is_one_line_naming_the_store_the_url_and_the_reason_and_exit_1(
    store_fixture, request, tmp_path, capsys
):
    handle = request.getfixturevalue(store_fixture)
    url = handle.url("tpudash/runs")
    local = RunStore(tmp_path / "runs")
    run_id = new_run_id("fit")
    local.create(run_id, "fit", {}, {}).close()
    handle.stop()
    store = f"the GCS emulator at {handle.server.endpoint}" if store_fixture == "gcs_store" else "S3 at "
    for argv in (["runs", "--runs-dir", url], ["copy", run_id, url, "--runs-dir", str(tmp_path / "runs")]):
        assert cli.main(argv) == 1
        captured = capsys.readouterr()
        assert captured.err.startswith(f"tpudash: error: cannot reach {url} ({store}")
        assert captured.err.count("\n") == 1 and "Traceback" not in captured.err


def test_a_stopped_gcs_emulator_is_given_the_store_timeout_and_no_more_and_gcsfs_says_nothing_on_the_terminal(
    gcs_store, monkeypatch, capsys
):
    """Issue 38, 1: 33-35 s of gcsfs's retries, then ~50 lines of its log and a traceback before tpudash's line."""
    from tests.object_stores import fast_gcsfs_retries  # (a plugin of this module: imported once it is loaded)

    fast_gcsfs_retries(monkeypatch, attempts=6)  # gcsfs's own six attempts: about half a minute against a stopped store
    url = gcs_store.url("tpudash/runs")
    gcs_store.stop()

    began = time.monotonic()
    assert cli.main(["runs", "--runs-dir", url, "--store-timeout", "1"]) == 1
    took = time.monotonic() - began
    captured = capsys.readouterr()
    endpoint = gcs_store.server.endpoint
    assert captured.err == (
        f"tpudash: error: cannot reach {url} (the GCS emulator at {endpoint}): no answer within 1 s "
        f"(--store-timeout); last error: connection refused by {endpoint.removeprefix('http://')}\n"
    )
    assert captured.out == "" and took < 4, took


@pytest.mark.parametrize("store_fixture", ["gcs_store", "s3_store"])
def test_a_bucket_that_does_not_exist_is_exit_2_naming_it_not_an_empty_runs_directory(store_fixture, request, capsys):
    handle = request.getfixturevalue(store_fixture)
    bucket = handle.server.new_bucket_name("nosuchbucket")  # never made
    url = handle.server.url(f"{bucket}/runs")
    assert cli.main(["runs", "--runs-dir", url]) == 2
    captured = capsys.readouterr()
    store = (
        f"the GCS emulator at {handle.server.endpoint}"
        if store_fixture == "gcs_store"
        else f"S3 at {handle.server.endpoint} (or none these credentials may see)"
    )
    assert captured.err == f"tpudash: error: {url}: there is no bucket {bucket!r} in {store}; check its name\n"
    assert captured.out == ""
    # A bucket that is there but holds no runs yet is no error.
    assert cli.main(["runs", "--runs-dir", handle.url("runs")]) == 0
    assert one_line(capsys.readouterr().out) == f"no runs yet in {handle.url('runs')}"


def test_a_gcs_emulator_is_used_without_credentials_or_their_warnings(gcs_store, tmp_path):
    """Issue 38, 3: "Could not determine bucket type… default credentials were not found" twice per command."""
    # A user's shell: the emulator's address, gcsfs's own defaults (no token, its default class).
    environment = {
        key: value
        for key, value in os.environ.items()
        if key not in ("FSSPEC_GS", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "GOOGLE_APPLICATION_CREDENTIALS")
    }
    url = gcs_store.url("tpudash/runs")
    listed = subprocess.run(
        [sys.executable, "-m", "tpudash", "runs", "--runs-dir", url],
        cwd=REPO_ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (listed.returncode, listed.stderr) == (0, "")
    assert one_line(listed.stdout) == f"no runs yet in {url}"


class AnonymousGcs:
    """gcsfs as it is on a machine without Google credentials: anonymous, refused by a private bucket."""

    class credentials:
        method = "anon"

    def ls(self, path, **kwargs):
        from gcsfs.retry import HttpError

        logging.getLogger("gcsfs").warning(
            "Could not determine bucket type for bucket name private: Your default credentials were not found."
        )
        raise HttpError({"code": 401, "message": "Anonymous caller does not have storage.objects.list access."})


def test_gcs_without_credentials_is_one_clear_line(monkeypatch, capsys):
    import fsspec.core

    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setattr(fsspec.core, "url_to_fs", lambda url, **options: (AnonymousGcs(), "private/runs"))
    assert cli.main(["runs", "--runs-dir", "gs://private/runs"]) == 1
    assert capsys.readouterr().err == (
        "tpudash: error: gs://private/runs (GCS): no Google Cloud credentials were found here, and GCS refused the "
        "request without them; run `gcloud auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS\n"
    )


def test_watch_ends_a_store_run_whose_writer_stopped_beating_as_stale_exit_1(tmp_path, capsys):
    url = memory_url()
    store = RunStore(url, spill_root=tmp_path / "unsent")
    run_id = new_run_id("fit")
    recorder = store.create(run_id, "fit", {}, {})
    assert isinstance(recorder, StoreRecorder)
    recorder.record(RunStarted(run_id, "fit", {}, {}, time.time()))
    recorder.record(Metric("loss", 0.25, step=0))
    assert recorder.record_uploaded.wait(10), "run.json never reached the store"
    recorder.close()  # no finish: its process went away
    long_ago = {"heartbeat": time.time() - 3600, "interval": 5.0, "writer": recorder.writer}
    store.files(run_id).write(f"{WRITERS_FOLDER}/{recorder.writer}.json", json.dumps(long_ago).encode())

    assert cli.main(["watch", run_id, "--runs-dir", url, "--telemetry-interval", "0"]) == 1
    out = one_line(capsys.readouterr().out)
    assert f"fit run {run_id}" in out
    assert f"stale: no heartbeat from the writer of {run_id} in 15 s and no finish" in out
