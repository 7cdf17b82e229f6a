"""``tpudash devices`` and ``tpudash run`` on a TPU host that is set up wrong, as a real process.

The host is faked at its seams only: tpu-info's chip scan (a sitecustomize
that answers for it), the installed distributions (dist-info directories that
importlib.metadata finds first), and a real process that holds libtpu's
lockfile. tpudash's own logic runs as shipped; TensorFlow is real.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.unit.test_cli import run_cli, run_dirs
from tpudash.accel import hostcheck

# The real TensorFlow here may start libtpu, whose lock is the host's (tests/conftest.py's libtpu_turn).
pytestmark = pytest.mark.usefixtures("libtpu_turn")


def fake_host(
    directory: Path, chips: tuple[str, int] | None = None, distributions: dict[str, str] | None = None
) -> dict:
    """Environment variables for a process that sees these chips and these installed distributions."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = []
    if chips is not None:
        chip_type, count = chips
        lines += [
            "from tpu_info import device",
            f"device.get_local_chips = lambda: (device.TpuChip.{chip_type}, {count})",
        ]
    (directory / "sitecustomize.py").write_text("\n".join(lines) + "\n")
    for name, version in (distributions or {}).items():
        info = directory / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return {"PYTHONPATH": str(directory)}


def test_a_libtpu_mismatch_on_a_tpu_host_exits_2_with_the_fix_instead_of_aborting(tmp_path):
    env = fake_host(tmp_path / "host", chips=("V4", 4), distributions={"tensorflow-tpu": "2.20.0", "libtpu": "0.0.52"})
    result = run_cli("devices", env=env)
    assert result.returncode == 2, result.stderr  # not 134: TensorFlow was never imported
    assert result.stderr.strip().endswith(
        "tensorflow-tpu 2.20.0 works with libtpu 0.0.17, but libtpu 0.0.52 is installed "
        '(TensorFlow aborts at import with it): pip install "libtpu==0.0.17"'
    )
    assert "TPU chips: 4 × TPU v4 chip, 32 GiB HBM each" in result.stdout


def test_a_tpu_held_by_another_process_names_it_and_jobs_run_on_the_cpu_default(tmp_path):
    env = fake_host(tmp_path / "host", chips=("V4", 4), distributions={"tensorflow-tpu": "2.20.0", "libtpu": "0.0.17"})
    existed = os.path.exists(hostcheck.LIBTPU_LOCKFILE)
    notebook = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"lock = open({hostcheck.LIBTPU_LOCKFILE!r}, 'a'); print('holding', flush=True); input()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert notebook.stdout.readline().strip() == "holding"
        devices = run_cli("devices", "--json", env=env)
        run = run_cli("run", "gradient-descent", "--set", "steps=2", env=env)
        explicit = run_cli("devices", "--tpu", "local", env=env)
    finally:
        notebook.communicate("")
        if not existed:
            os.unlink(hostcheck.LIBTPU_LOCKFILE)

    assert devices.returncode == 0, devices.stderr
    description = json.loads(devices.stdout)
    assert (description["kind"], description["num_replicas"]) == ("CPU", 8)
    # Tests that may load libtpu take turns (libtpu_turn), so the notebook is the one holder named.
    assert [holder["pid"] for holder in description["host_check"]["holders"]] == [notebook.pid]
    assert f"the TPU is held by pid {notebook.pid} ({sys.executable} -c lock = open(" in description["reasons"]["TPU"]
    assert run.returncode == 0, run.stderr
    assert explicit.returncode == 2
    assert f"held by pid {notebook.pid}" in explicit.stderr
    assert "--tpu none runs jobs on the CPU default" in explicit.stderr


@pytest.mark.skipif(
    "tensorflow-tpu" in hostcheck.installed_distributions(),
    reason="the TPU build is installed here; test_hostcheck covers this diagnosis on its own",
)
def test_the_cpu_build_on_a_tpu_host_gives_the_install_line_for_the_tpu_build(tmp_path):
    env = fake_host(tmp_path / "host", chips=("V5E", 8))
    result = run_cli("devices", "--tpu", "local", env=env)
    assert result.returncode == 2
    message = result.stderr.strip()
    assert "this host has 8 TPU v5e chips but the CPU build of TensorFlow is installed (tensorflow " in message
    assert 'pip install "tensorflow-tpu==2.20.0" "libtpu==0.0.17"' in message


@pytest.mark.slow  # long: CI runs it after the default suite (pytest -m slow)
def test_an_automatic_tpu_that_never_answers_falls_back_to_eight_cpu_devices_in_a_fresh_process(isolated_runs_dir):
    # A legacy Colab TPU address (TPU Node) nobody listens on: the real
    # TensorFlow tries to connect, the attempt is bounded, and the CPU default
    # starts over in a new process (this one can no longer split the CPU).
    result = run_cli("devices", "--json", env={"COLAB_TPU_ADDR": "127.0.0.1:9", "TPUDASH_TPU_TIMEOUT": "3"})
    assert result.returncode == 0, result.stderr
    description = json.loads(result.stdout)
    assert (description["kind"], description["num_replicas"]) == ("CPU", 8)
    assert description["reasons"]["TPU"] == (
        "COLAB_TPU_ADDR=127.0.0.1:9, but connecting to TPU grpc://127.0.0.1:9 did not answer within 3 s "
        "(raise TPUDASH_TPU_TIMEOUT to wait longer)"
    )
    assert "starting over on the CPU default (--tpu none)" in result.stderr
    assert not any("logical devices were already configured" in note for note in description["notes"])


def test_run_with_a_bad_setup_starts_nothing(tmp_path, isolated_runs_dir):
    env = fake_host(tmp_path / "host", chips=("V4", 4), distributions={"tensorflow-tpu": "2.20.0", "libtpu": "0.0.52"})
    result = run_cli("run", "gradient-descent", env=env)
    assert result.returncode == 2
    assert 'pip install "libtpu==0.0.17"' in result.stderr
    assert run_dirs(isolated_runs_dir) == []


def test_an_explicit_tpu_that_cannot_start_is_tried_in_a_child_and_refused_with_its_message(tmp_path):
    # The probe child really imports this TensorFlow and initialises 'local'
    # on a host whose chip scan says "4 TPU v4 chips" but that has none.
    env = fake_host(tmp_path / "host", chips=("V4", 4), distributions={"tensorflow-tpu": "2.20.0", "libtpu": "0.0.17"})
    result = run_cli("devices", "--tpu", "local", env={**env, "TPUDASH_TPU_TIMEOUT": "20"})
    assert result.returncode == 2
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith("tpudash: error: --tpu local given, but ")
    assert message.endswith("--tpu none runs jobs on the CPU default")
    if "tensorflow-tpu" in hostcheck.installed_distributions():
        # libtpu, off Google Cloud, asks the metadata server until the child is killed.
        assert "TensorFlow's TPU start-up did not finish within 20 s" in message
    else:
        # The CPU build answers with the error TPU users meet most.
        assert "initializing TPU 'local' failed: NotFoundError:" in message and "ConfigureDistributedTPU" in message
        assert "with these attrs" not in message  # TensorFlow's attribute dump says nothing to a user
    # The child does not outlive its timeout: nothing holds the TPU afterwards.
    assert hostcheck.find_tpu_holders() == []


def test_a_tpu_probe_dies_with_the_tpudash_that_started_it(tmp_path):
    # A probe left behind by a killed tpudash would hold the TPU for good.
    # TensorFlow is faked by a module whose import never returns, as libtpu's
    # start-up does off Google Cloud.
    (tmp_path / "tensorflow.py").write_text("import threading\nthreading.Event().wait()\n")
    parent_script = (
        "import os, subprocess, sys\n"
        "probe = subprocess.Popen([sys.executable, '-m', 'tpudash.accel.tpuprobe', str(os.getpid())],\n"
        "                         stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)\n"
        'probe.stdin.write(\'{"type": "probe", "tpu": "local", "id": 1}\\n\')\n'
        "probe.stdin.flush()\n"
        "print(probe.pid, flush=True)\n"
        "sys.stdin.read()\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
        env=dict(os.environ, PYTHONPATH=str(tmp_path)),
    )
    probe_pid = int(parent.stdout.readline())
    probe_exited = os.pidfd_open(probe_pid)
    try:
        parent.kill()
        parent.wait()
        readable, _, _ = select.select([probe_exited], [], [], 30)
        assert readable, f"the probe (pid {probe_pid}) outlived its parent"
    finally:
        os.close(probe_exited)
        parent.stdout.close()
        parent.stdin.close()
