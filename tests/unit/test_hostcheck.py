"""The host scan that runs before TensorFlow: chips, installed builds, the TPU's holder, diagnoses.

Each part is tested by faking the environment at its seam — tpu-info's chip
scan, the package metadata, a /proc tree — never tpudash's own logic.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from dataclasses import asdict

import pytest
import tomllib
from tpu_info import device as tpu_info_device

from tests.conftest import REPO_ROOT
from tpudash.accel import hostcheck
from tpudash.accel.hostcheck import Chips, TpuHolder, diagnose

V4 = Chips(chip_type="TPU v4 chip", count=4, hbm_gib_per_chip=32, cores_per_chip=1)
TPU_BUILD = {"tensorflow-tpu": "2.20.0", "libtpu": "0.0.17"}


def codes(diagnoses) -> list[str]:
    return [item.code for item in diagnoses]


# -- the chip scan (tpu-info) ---------------------------------------------------------------


def test_the_chip_scan_reports_type_count_and_hbm_from_tpu_info(monkeypatch):
    monkeypatch.setattr(tpu_info_device, "get_local_chips", lambda: (tpu_info_device.TpuChip.V5E, 8))
    chips = hostcheck.scan_chips()
    assert chips == Chips(chip_type="TPU v5e chip", count=8, hbm_gib_per_chip=16, cores_per_chip=1)
    assert chips.describe() == "8 × TPU v5e chip, 16 GiB HBM each, 1 TensorCore(s) each"


def test_a_chip_scan_that_fails_says_why_instead_of_crashing(monkeypatch):
    def mixed_chips():
        raise AssertionError("Expected one chip type, got Counter({V4: 1, V5E: 1})")

    monkeypatch.setattr(tpu_info_device, "get_local_chips", mixed_chips)
    chips = hostcheck.scan_chips()
    assert chips.count == 0
    assert chips.scan_error.startswith("the PCI scan failed: AssertionError: Expected one chip type")
    assert chips.describe().startswith("unknown (the PCI scan failed")


def test_this_machine_has_no_tpu_chip_and_the_real_scan_says_so():
    # This host's PCI bus has no device of Google's vendor id (0x1ae0).
    chips = hostcheck.scan_chips()
    assert chips == Chips()
    assert chips.describe() == "none (no PCI device of Google's vendor id 0x1ae0)"


# -- installed builds (package metadata) ----------------------------------------------------


def test_installed_distributions_reads_package_metadata():
    versions = {"tensorflow-tpu": "2.20.0", "libtpu": "0.0.52"}

    def version_of(name):
        if name not in versions:
            raise importlib.metadata.PackageNotFoundError(name)
        return versions[name]

    assert hostcheck.installed_distributions(version_of) == versions


def test_the_real_metadata_shows_the_build_this_suite_runs_on():
    installed = hostcheck.installed_distributions()
    assert installed.get("tensorflow") or installed.get("tensorflow-tpu")
    import tensorflow as tf

    assert tf.__version__ in installed.values()


# -- the TPU's holder (/proc) ---------------------------------------------------------------


def fake_process(proc, pid: int, command: list[str], open_paths: list[str]) -> None:
    (proc / str(pid) / "fd").mkdir(parents=True)
    (proc / str(pid) / "cmdline").write_bytes(b"\0".join(part.encode() for part in command) + b"\0")
    for number, path in enumerate(open_paths, start=3):
        os.symlink(path, proc / str(pid) / "fd" / str(number))


def test_holders_are_processes_with_a_tpu_device_or_libtpus_lockfile_open(tmp_path):
    proc = tmp_path / "proc"
    fake_process(proc, 4242, ["python3", "train.py", "--epochs", "5"], ["/dev/accel0", "/dev/accel1", "/tmp/x.log"])
    fake_process(proc, 5150, ["/usr/bin/python3", "-m", "ipykernel_launcher"], [hostcheck.LIBTPU_LOCKFILE])
    fake_process(proc, 6001, ["vim", "notes.txt"], ["/dev/pts/0", "/dev/vfio/vfio"])  # the VFIO container is not a chip
    fake_process(proc, 7000, ["python3", "me.py"], ["/dev/vfio/0"])
    (proc / "self").mkdir()

    holders = hostcheck.find_tpu_holders(proc, own_pid=7000)

    assert holders == [
        TpuHolder(4242, "python3 train.py --epochs 5", ("/dev/accel0", "/dev/accel1")),
        TpuHolder(5150, "/usr/bin/python3 -m ipykernel_launcher", (hostcheck.LIBTPU_LOCKFILE,)),
    ]


@pytest.mark.usefixtures("libtpu_turn")  # it holds the host's real lock file: tests that look at it take turns
def test_a_real_process_holding_libtpus_lockfile_is_found():
    import subprocess

    existed = os.path.exists(hostcheck.LIBTPU_LOCKFILE)
    holder = subprocess.Popen(
        [sys.executable, "-c", f"f = open({hostcheck.LIBTPU_LOCKFILE!r}, 'a'); print('ready', flush=True); input()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        found = {item.pid: item for item in hostcheck.find_tpu_holders()}
        assert holder.pid in found
        assert found[holder.pid].paths == (hostcheck.LIBTPU_LOCKFILE,)
        assert found[holder.pid].command.startswith(sys.executable + " -c f = open(")
    finally:
        holder.communicate("")
        if not existed:
            os.unlink(hostcheck.LIBTPU_LOCKFILE)


# -- diagnoses ------------------------------------------------------------------------------


def test_without_tensorflow_the_one_install_line_fits_the_host():
    on_cpu = diagnose(Chips(), {}, [])
    assert codes(on_cpu) == ["no-tensorflow"]
    assert on_cpu[0].message.endswith('pip install "tensorflow>=2.20,<2.22"')
    assert on_cpu[0].blocks_tensorflow

    on_tpu = diagnose(V4, {}, [])
    assert on_tpu[0].message.endswith('pip install "tensorflow-tpu==2.20.0" "libtpu==0.0.17"')
    assert "for this host's 4 TPU v4 chips" in on_tpu[0].message


def test_beside_jax_on_a_tpu_host_the_install_line_keeps_jaxs_libtpu():
    # Colab's TPU runtime: JAX with its own libtpu, no TensorFlow. The pinned pair would replace that libtpu.
    beside_jax = diagnose(V4, {"jax": "0.10.2", "libtpu": "0.0.30"}, [])
    assert codes(beside_jax) == ["no-tensorflow"]
    message = beside_jax[0].message
    assert "JAX uses libtpu 0.0.30 here" in message and "virtual environment of its own" in message
    assert message.endswith('~/tpudash-tf/bin/pip install "./tpudash[tpu]"')
    assert "watching your own training work without it" in message
    # JAX off a TPU host, or a libtpu that already is the pinned one: the one install line, as always.
    assert diagnose(Chips(), {"jax": "0.10.2"}, [])[0].message.endswith('pip install "tensorflow>=2.20,<2.22"')
    same_libtpu = diagnose(V4, {"jax": "0.10.2", "libtpu": "0.0.17"}, [])[0].message
    assert same_libtpu.endswith('pip install "tensorflow-tpu==2.20.0" "libtpu==0.0.17"')


def test_the_cpu_build_on_a_tpu_host_names_the_build_and_gives_the_tpu_install_line():
    found = diagnose(V4, {"tensorflow": "2.21.0"}, [])
    assert codes(found) == ["cpu-build-on-tpu-host"]
    message = found[0].message
    assert "4 TPU v4 chips" in message and "(tensorflow 2.21.0)" in message
    assert message.endswith('pip uninstall -y tensorflow && pip install "tensorflow-tpu==2.20.0" "libtpu==0.0.17"')
    assert found[0].blocks_tpu and not found[0].blocks_tensorflow


def test_the_cpu_build_off_a_tpu_host_is_fine():
    assert diagnose(Chips(), {"tensorflow": "2.21.0"}, []) == []


def test_the_tested_tpu_pair_is_fine():
    assert diagnose(V4, TPU_BUILD, []) == []


def test_a_libtpu_that_does_not_match_names_both_versions_and_the_fix():
    found = diagnose(V4, {"tensorflow-tpu": "2.20.0", "libtpu": "0.0.52"}, [])
    assert codes(found) == ["libtpu-mismatch"]
    assert found[0].message == (
        "tensorflow-tpu 2.20.0 works with libtpu 0.0.17, but libtpu 0.0.52 is installed "
        '(TensorFlow aborts at import with it): pip install "libtpu==0.0.17"'
    )
    # On a TPU host libtpu loads at import, so TensorFlow must not be imported at all.
    assert found[0].blocks_tensorflow
    # Off one tpudash keeps libtpu from loading: still worth a line, not a refusal.
    off_tpu = diagnose(Chips(), {"tensorflow-tpu": "2.20.0", "libtpu": "0.0.52"}, [])
    assert codes(off_tpu) == ["libtpu-mismatch"] and not off_tpu[0].blocks_tensorflow


def test_a_missing_libtpu_and_an_untested_tpu_build_are_named():
    assert codes(diagnose(V4, {"tensorflow-tpu": "2.20.0"}, [])) == ["libtpu-missing"]
    untested = diagnose(V4, {"tensorflow-tpu": "2.19.1", "libtpu": "0.0.12"}, [])
    assert codes(untested) == ["unknown-tpu-build"]
    assert "not tensorflow-tpu 2.19.1 and libtpu 0.0.12" in untested[0].message
    assert not untested[0].blocks_tpu


def test_two_builds_installed_together_are_named():
    found = diagnose(V4, {"tensorflow": "2.21.0", **TPU_BUILD}, [])
    assert codes(found) == ["several-tensorflow-builds"]
    assert found[0].message.startswith("tensorflow 2.21.0, tensorflow-tpu 2.20.0 are installed together")


def test_a_held_tpu_names_the_pid_and_command_and_offers_the_cpu_default():
    holder = TpuHolder(4242, "python3 train.py", ("/dev/accel0",))
    found = diagnose(V4, TPU_BUILD, [holder])
    assert codes(found) == ["tpu-held"]
    assert "held by pid 4242 (python3 train.py) through /dev/accel0" in found[0].message
    assert "jobs run on the CPU default" in found[0].message
    assert found[0].message.endswith("release the TPU in that process (or end it), then re-initialise")


def test_inspect_finds_tensorflow_without_importing_it():
    import subprocess

    script = (
        "import sys; from tpudash.accel import hostcheck; check = hostcheck.inspect(); "
        "print(check.tensorflow_found, check.tensorflow_build is not None, 'tensorflow' in sys.modules)"
    )
    output = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=REPO_ROOT)
    assert output.stdout.split() == ["True", "True", "False"]


# -- the pins -------------------------------------------------------------------------------


def test_the_install_lines_use_the_pins_of_pyprojects_extras():
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(hostcheck.CPU_BUILD) <= set(extras["cpu"])
    assert set(hostcheck.TPU_BUILD) <= set(extras["tpu"])
    for tensorflow_tpu, libtpu in hostcheck.TPU_BUILD_PAIRS.items():
        assert f"tensorflow-tpu=={tensorflow_tpu}" in extras["tpu"] and f"libtpu=={libtpu}" in extras["tpu"]
    base = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert not [item for item in base if item.startswith(("tensorflow", "libtpu", "keras"))]


# -- which framework holds the TPU ------------------------------------------------------------------------------

SITE = "/home/me/venv-jax/lib/python3.11/site-packages"


def mapped(*libraries: str) -> str:
    """/proc/PID/maps lines: anonymous memory and the heap, then each library mapped."""
    lines = [
        "7f0000000000-7f0000001000 rw-p 00000000 00:00 0",
        "55d000000000-55d000100000 rw-p 00000000 00:00 0 [heap]",
    ]
    for number, library in enumerate(libraries):
        lines.append(f"7f10{number:08x}-7f11{number:08x} r-xp 00000000 08:01 {1000 + number} {library}")
    return "\n".join(lines) + "\n"


def test_a_holders_framework_comes_from_the_libraries_it_loaded(tmp_path):
    proc = tmp_path / "proc"
    fake_process(proc, 1234, ["python", "train.py"], ["/dev/accel0"])
    (proc / "1234" / "maps").write_text(mapped(f"{SITE}/numpy/_core/_multiarray_umath.so", f"{SITE}/jaxlib/_jax.so"))
    fake_process(proc, 1300, ["python", "fit.py"], ["/dev/accel1"])
    (proc / "1300" / "maps").write_text(
        mapped(
            "/opt/tf/tensorflow/libtensorflow_framework.so.2",
            "/opt/tf/tensorflow/python/_pywrap_tensorflow_internal.so",
        )
    )
    fake_process(proc, 1400, ["python", "xla.py"], ["/dev/accel2"])
    (proc / "1400" / "maps").write_text(mapped(f"{SITE}/torch/lib/libtorch.so", f"{SITE}/torch_xla/lib/libtpu.so"))
    # Only the virtualenv's name says "jax": no framework; and a process whose maps cannot be read (gone, or
    # another user's) is still a holder, of an unknown framework.
    fake_process(proc, 1500, ["python", "plain.py"], ["/dev/accel3"])
    (proc / "1500" / "maps").write_text(mapped(f"{SITE}/numpy/_core/_multiarray_umath.so"))
    fake_process(proc, 1600, ["python", "gone.py"], ["/dev/vfio/0"])

    holders = {holder.pid: holder for holder in hostcheck.find_tpu_holders(proc, own_pid=1)}

    assert {pid: holder.framework for pid, holder in holders.items()} == {
        1234: "JAX",
        1300: "TensorFlow",
        1400: "PyTorch/XLA",
        1500: "",
        1600: "",
    }
    assert holders[1234].describe() == "the JAX process pid 1234 (python train.py)"
    assert holders[1500].describe() == "pid 1500 (python plain.py)"
    check = hostcheck.inspect(chip_scan=lambda: V4, distributions=lambda: TPU_BUILD, holders=lambda: [holders[1234]])
    assert (
        "the TPU is held by the JAX process pid 1234 (python train.py) through /dev/accel0"
        in check.diagnoses[0].message
    )
    held_line = [line for line in hostcheck.host_lines(check.to_dict()) if line[0] == "TPU held by"]
    assert held_line == [("TPU held by", "the JAX process pid 1234 (python train.py) via /dev/accel0", "yellow")]


def test_reading_a_holders_maps_is_bounded(tmp_path):
    process_dir = tmp_path / "1234"
    process_dir.mkdir()
    filler = [f"{SITE}/numpy/lib{number}.so" for number in range(2000)]
    (process_dir / "maps").write_text(mapped(*filler, f"{SITE}/jaxlib/_jax.so"))
    assert hostcheck.loaded_framework(process_dir) == "JAX"
    assert hostcheck.loaded_framework(process_dir, limit=64 * 1024) == ""  # JAX's line lies past the bound


def test_tpudashs_own_processes_are_not_foreign_holders():
    other_engine = TpuHolder(77, "/usr/bin/python3 -m tpudash.engine", ("/dev/accel0",), "TensorFlow")
    probe = TpuHolder(78, "/usr/bin/python3 -m tpudash.telemetry.tensorcore", ("/dev/accel0",))
    headless = TpuHolder(79, "/usr/bin/python3 -m tpudash run train", ("/dev/accel0",), "TensorFlow")
    jax = TpuHolder(80, "python -m tpudash_examples.jax_loop", ("/dev/accel0",), "JAX")
    assert other_engine.from_tpudash and probe.from_tpudash
    assert not headless.from_tpudash and not jax.from_tpudash

    def check(*holders: TpuHolder) -> dict:
        return {"holders": [asdict(holder) for holder in holders]}

    assert hostcheck.foreign_holder(check(other_engine, probe)) is None
    assert hostcheck.foreign_holder(check(other_engine, jax)) == jax
    assert hostcheck.foreign_holder(check(headless)) == headless  # `tpudash run` in another terminal: no engine lock
    assert hostcheck.foreign_holder({"holders": []}) is None
