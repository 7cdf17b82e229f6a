"""Settings: flags beat TPUDASH_* variables beat defaults, and bad values are named."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from tpudash.config import Settings, SettingsError


def test_defaults_follow_xdg_and_split_the_cpu_into_eight():
    settings = Settings.load({}, environ={"XDG_DATA_HOME": "/data"})
    assert settings.cpu_devices == 8
    assert settings.tpu is None
    assert settings.runs_dir == Path("/data/tpudash/runs")


def test_flags_beat_environment_beats_defaults():
    environ = {"TPUDASH_CPU_DEVICES": "4", "TPUDASH_RUNS_DIR": "/env/runs", "TPUDASH_TPU": "env-tpu"}
    from_env = Settings.load({}, environ=environ)
    assert (from_env.cpu_devices, from_env.runs_dir, from_env.tpu) == (4, Path("/env/runs"), "env-tpu")
    from_flags = Settings.load({"cpu_devices": "2", "runs_dir": "/flag/runs", "tpu": None}, environ=environ)
    assert (from_flags.cpu_devices, from_flags.runs_dir, from_flags.tpu) == (2, Path("/flag/runs"), "env-tpu")


def test_the_engine_gives_way_idle_by_default_or_by_a_nice_value():
    assert Settings.load({}, environ={}).engine_nice == "idle"
    assert Settings.load({}, environ={"TPUDASH_ENGINE_NICE": " IDLE "}).engine_nice == "idle"
    assert Settings.load({}, environ={"TPUDASH_ENGINE_NICE": "10"}).engine_nice == 10


@pytest.mark.parametrize(
    ("flags", "environ", "message"),
    [
        ({"cpu_devices": "0"}, {}, "--cpu-devices: 0 is out of range; allowed: 1 to 256"),
        ({"cpu_devices": "100000"}, {}, "out of range"),
        ({"cpu_devices": "eight"}, {}, "--cpu-devices: 'eight' is not an integer"),
        ({}, {"TPUDASH_CPU_DEVICES": "-3"}, "TPUDASH_CPU_DEVICES: -3 is out of range"),
        ({"tpu": "  "}, {}, "--tpu: is empty"),
        ({}, {"TPUDASH_TPU_TIMEOUT": "0"}, "TPUDASH_TPU_TIMEOUT: 0 is out of range"),
        ({"release_after": "-1"}, {}, "--release-after: -1 is out of range; allowed: 0 to 604800 seconds"),
        ({}, {"TPUDASH_RELEASE_AFTER": "soon"}, "TPUDASH_RELEASE_AFTER: 'soon' is not a number"),
        ({"cancel_grace": "0"}, {}, "--cancel-grace: 0 is out of range; allowed: 0.1 to 60 seconds"),
        ({}, {"TPUDASH_ENGINE_NICE": "20"}, "TPUDASH_ENGINE_NICE: 20 is out of range; allowed: idle, or 0 to 19"),
        (
            {},
            {"TPUDASH_ENGINE_NICE": "low"},
            "TPUDASH_ENGINE_NICE: 'low' is neither idle nor an integer; allowed: idle",
        ),
    ],
)
def test_bad_settings_name_the_flag_or_variable(flags, environ, message):
    with pytest.raises(SettingsError) as caught:
        Settings.load(flags, environ=environ)
    assert message in str(caught.value)


def test_a_data_dir_that_is_a_file_is_rejected(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(SettingsError, match="--data-dir: .* is not a readable directory"):
        Settings.load({"data_dir": str(not_a_dir)}, environ={})


def lock_directory(monkeypatch, locked: Path) -> None:
    """Make ``locked`` a directory this process may neither read nor write into, root included.

    Root ignores permission bits (and CI runs as root), so chmod cannot make
    one. The kernel's answers to a user without the rights are given where
    tpudash asks: ``os.access`` says no for ``locked`` and below, and
    ``os.mkdir`` below it fails with EACCES (Permission denied).
    """
    locked.mkdir(exist_ok=True)
    locked = locked.resolve()
    real_access, real_mkdir = os.access, os.mkdir

    def under_locked(path) -> bool:
        resolved = Path(os.fsdecode(path)).absolute()
        return resolved == locked or locked in resolved.parents

    def access(path, mode, *args, **kwargs):
        if mode != os.F_OK and under_locked(path):
            return False
        return real_access(path, mode, *args, **kwargs)

    def mkdir(path, mode=0o777, *args, **kwargs):
        if under_locked(path) and Path(os.fsdecode(path)).absolute() != locked:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fsdecode(path))
        return real_mkdir(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "access", access)
    monkeypatch.setattr(os, "mkdir", mkdir)


def test_an_unwritable_runs_dir_is_reported_and_nothing_is_created(tmp_path, monkeypatch):
    locked = tmp_path / "locked"
    lock_directory(monkeypatch, locked)
    settings = Settings.load({"runs_dir": str(locked / "runs")}, environ={})
    with pytest.raises(SettingsError) as caught:
        settings.check_runs_dir()
    assert str(caught.value) == f"--runs-dir / TPUDASH_RUNS_DIR: cannot create {locked}/runs: Permission denied"
    assert list(locked.iterdir()) == []


def test_an_unreadable_data_dir_is_rejected(tmp_path, monkeypatch):
    locked = tmp_path / "locked"
    lock_directory(monkeypatch, locked)
    with pytest.raises(SettingsError) as caught:
        Settings.load({"data_dir": str(locked)}, environ={})
    assert str(caught.value) == f"--data-dir: {locked} is not a readable directory"


def test_a_runs_dir_under_a_file_is_reported(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    with pytest.raises(SettingsError, match=f"--runs-dir: {blocker}/runs cannot be a directory: {blocker} is a file"):
        Settings.load({"runs_dir": str(blocker / "runs")}, environ={})


def test_a_data_dir_below_a_file_is_rejected_before_tfds_sees_it(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    with pytest.raises(SettingsError, match=f"--data-dir: {blocker}/sub cannot be a directory: {blocker} is a file"):
        Settings.load({"data_dir": str(blocker / "sub")}, environ={})
