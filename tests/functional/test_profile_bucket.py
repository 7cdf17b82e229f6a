"""A profile of a run in a bucket, asked for from another process: ``tpudash profile RUN --json`` (the real CLI).

A user's ``model.fit`` with ``TpudashCallback(runs_dir="gs://…")`` trains in
its own process (``tests.functional.bucket_profile_fit``) against the
loopback GCS emulator (``tests.object_stores``). From a second process the
user runs ``tpudash profile RUN --json --steps 3``: the request rides the
bucket, the fit's callback captures three steps and uploads the capture, the
CLI downloads it, converts it with XProf, prints the summary and uploads
``summary.json`` beside the capture, where XProf and the dashboard look.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

pytest_plugins = ["tests.object_stores"]  # gcs_store: the loopback GCS emulator

# A TensorFlow import and a fit, or a CLI that converts with XProf, on a loaded 2-core machine.
CHILD_TIMEOUT = 180.0
# What a user's shell would not have: the libtpu settings this test process keeps for itself (tests/conftest.py).
USER_UNSET = ("TPU_NAME", "COLAB_TPU_ADDR", "TPU_LOAD_LIBRARY", "TPU_SKIP_MDS_QUERY")


def child_environment(cache_home: Path) -> dict[str, str]:
    """This test's environment (the store's endpoint and settings included), with a cache of the test's own."""
    environment = {key: value for key, value in os.environ.items() if key not in USER_UNSET}
    environment["XDG_CACHE_HOME"] = str(cache_home)  # where the CLI downloads a bucket's capture to convert it
    return environment


def line_from(process: subprocess.Popen, timeout: float = CHILD_TIMEOUT) -> str:
    """The child's next line on stdout ("" at its end); AssertionError if none comes within ``timeout`` s."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(process.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not lines:
        raise AssertionError(f"no line from {process.args} within {timeout:g} s")
    return lines[0].strip()


@pytest.mark.slow  # a TensorFlow fit and XProf in children: CI runs it after the default suite (pytest -m slow)
def test_tpudash_profile_from_another_process_profiles_a_fit_whose_run_is_in_a_bucket(gcs_store, tmp_path):
    url = gcs_store.url("runs")
    environment = child_environment(tmp_path / "cache")
    with (tmp_path / "fit.err").open("w") as fit_errors:
        fit = subprocess.Popen(
            [sys.executable, "-m", "tests.functional.bucket_profile_fit", url],
            cwd=REPO_ROOT,
            env=environment,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=fit_errors,
            text=True,
        )
    try:
        live = line_from(fit)
        assert live.startswith("live "), (tmp_path / "fit.err").read_text()
        run_id = live.split(" ", 1)[1]

        profiled = subprocess.run(
            [sys.executable, "-m", "tpudash", "profile", run_id, "--runs-dir", url, "--json", "--steps", "3"],
            cwd=REPO_ROOT,
            env=environment,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT,
        )
        assert profiled.returncode == 0, profiled.stderr
        summary = json.loads(profiled.stdout)
        print(profiled.stdout)  # what the user reads (pytest -s shows it)
        assert summary["run_id"] == run_id and summary["framework"] == "tensorflow"
        assert summary["steps"] == 3 and summary["verdict"] in ("input-bound", "not input-bound")  # steps seen
        first = int(summary["per_step"][0]["step"])
        assert [row["step"] for row in summary["per_step"]] == [str(first + n) for n in range(3)]
        assert summary["profile_dir"] == f"{url}/{run_id}/profile"
        capture = summary["capture"]

        fit.stdin.write("stop\n")
        fit.stdin.flush()
        assert line_from(fit) == f"done {run_id}", (tmp_path / "fit.err").read_text()
        assert fit.wait(CHILD_TIMEOUT) == 0, (tmp_path / "fit.err").read_text()
    finally:
        if fit.poll() is None:
            fit.kill()
        fit.wait(CHILD_TIMEOUT)

    # In the bucket, where XProf (xprof --logdir gs://…/RUN/profile) and the dashboard look: the capture
    # the fit uploaded and the summary the CLI uploaded beside it.
    filesystem = gcs_store.filesystem()
    folder = f"{gcs_store.bucket}/runs/{run_id}/profile/plugins/profile/{capture}"
    names = {path.rsplit("/", 1)[1] for path in filesystem.ls(folder, refresh=True)}
    assert {f"{host}.xplane.pb" for host in summary["hosts"]} | {"summary.json"} <= names, names
    uploaded = json.loads(filesystem.cat_file(f"{folder}/summary.json"))
    assert uploaded["capture"] == capture and uploaded["steps"] == summary["steps"]
