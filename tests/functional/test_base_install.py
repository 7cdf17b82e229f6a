"""``pip install tpudash`` without an extra: no TensorFlow, and tpudash still helps.

A fresh virtual environment gets the base install exactly as a user on a
machine without TensorFlow would (`pip install .`). It must not bring
TensorFlow; the dashboard must still draw; `tpudash runs` and `tpudash jobs`
must work; `tpudash devices` and `tpudash run` must give the one install line
that fits this host and exit 2, starting nothing.
"""

from __future__ import annotations

import json
import subprocess
import venv
from pathlib import Path

import pytest

from jobs.events import RunFinished
from tests.benchmarks.bench_first_frame import first_frame_seconds
from tests.conftest import REPO_ROOT
from tpudash.runs.layout import new_run_id
from tpudash.runs.store import RunStore

# A whole-process end-to-end test: CI runs it after the default suite (pytest -m slow).
pytestmark = pytest.mark.slow

CPU_INSTALL_LINE = 'pip install "tensorflow>=2.20,<2.22"'


@pytest.fixture(scope="module")
def base_install(tmp_path_factory) -> Path:
    """A virtual environment with `pip install <checkout>` and nothing else."""
    home = tmp_path_factory.mktemp("base-install")
    venv.create(home / "venv", with_pip=True)
    python = home / "venv" / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", str(REPO_ROOT)],
        check=True,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return python


def tpudash(python: Path, *argv: str, runs_dir: Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(python), "-m", "tpudash", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "TPUDASH_RUNS_DIR": str(runs_dir), "HOME": str(cwd)},
    )


def test_the_base_install_brings_no_tensorflow(base_install, tmp_path):
    listed = subprocess.run(
        [str(base_install), "-m", "pip", "list", "--format", "json"], capture_output=True, text=True, check=True
    )
    names = {item["name"].lower() for item in json.loads(listed.stdout)}
    assert {"tpudash", "textual", "tpu-info"} <= names
    assert not {"tensorflow", "tensorflow-tpu", "libtpu", "keras"} & names


def test_without_tensorflow_devices_and_run_give_the_install_line_and_start_nothing(base_install, tmp_path):
    runs_dir = tmp_path / "runs"
    devices = tpudash(base_install, "devices", runs_dir=runs_dir, cwd=tmp_path)
    assert devices.returncode == 2
    assert devices.stderr.strip().endswith(CPU_INSTALL_LINE)
    assert "TensorFlow build: not installed" in devices.stdout
    assert "TPU chips: none" in devices.stdout

    as_json = tpudash(base_install, "devices", "--json", runs_dir=runs_dir, cwd=tmp_path)
    assert json.loads(as_json.stdout)["host_check"]["install_line"] == CPU_INSTALL_LINE

    run = tpudash(base_install, "run", "gradient-descent", runs_dir=runs_dir, cwd=tmp_path)
    assert run.returncode == 2
    assert run.stderr.strip().endswith(CPU_INSTALL_LINE)
    assert not [path for path in runs_dir.glob("*") if not path.name.startswith(".")]

    bad = tpudash(base_install, "run", "gradient-descent", "--set", "steps=0", runs_dir=runs_dir, cwd=tmp_path)
    assert bad.returncode == 2 and "steps" in bad.stderr  # params are still checked first


def test_without_tensorflow_history_jobs_and_the_dashboard_work(base_install, tmp_path):
    runs_dir = tmp_path / "runs"
    recorder = RunStore(runs_dir).create(
        new_run_id("gradient-descent"), "gradient-descent", {"steps": 20}, {"kind": "CPU"}
    )
    recorder.record(RunFinished(status="done", summary={"loss": 0.0022596875205636024}))

    runs = tpudash(base_install, "runs", "--json", runs_dir=runs_dir, cwd=tmp_path)
    assert runs.returncode == 0, runs.stderr
    assert [item["status"] for item in json.loads(runs.stdout)] == ["done"]

    jobs = tpudash(base_install, "jobs", "--json", runs_dir=runs_dir, cwd=tmp_path)
    assert jobs.returncode == 0, jobs.stderr
    assert "gradient-descent" in {item["name"] for item in json.loads(jobs.stdout)}

    first_frame = first_frame_seconds(str(base_install), runs_dir=str(runs_dir), cwd=str(tmp_path))
    assert first_frame > 0


def test_the_base_install_serves_the_dashboard_page(base_install, tmp_path):
    # The page and textual-serve's scripts come from the installed package, not the checkout.
    import urllib.request

    from tests.serve_process import start_server

    server = start_server(
        tmp_path, python=str(base_install), cwd=tmp_path, base_env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    )
    # As a browser: the printed URL's token is swapped for a cookie, which admits the page's scripts.
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
    try:
        page = browser.open(server.url, timeout=10).read().decode()
        assert 'src="static/js/textual.js"' in page
        assert browser.open(server.base + "static/js/textual.js", timeout=10).status == 200
    finally:
        server.stop()
    assert server.process.returncode == 0, server.log()
