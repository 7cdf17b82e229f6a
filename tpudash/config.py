"""One Settings object: command-line flags > TPUDASH_* variables > defaults.

Every value is checked here, so a bad ``--cpu-devices`` or an unwritable runs
directory is a clear message and exit code 2, never a traceback later on.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path

from tpudash.runs.location import missing_library, parse_runs_dir
from tpudash.runs.storeclient import DEFAULT_STORE_TIMEOUT, STORE_TIMEOUT_RANGE
from tpudash.telemetry.sources import DEFAULT_TPU_METRICS_ADDRESS, AddressError, parse_metrics_address

DEFAULT_CPU_DEVICES = 8
DEFAULT_TELEMETRY_INTERVAL_SECONDS = 1.0
# 0 turns telemetry sampling off; otherwise between these.
TELEMETRY_INTERVAL_RANGE = (0.1, 60.0)
MAX_CPU_DEVICES = 256
FRAMEWORK_CHOICES = ("auto", "tensorflow", "jax")
"""What runs the engine's jobs: ``auto`` is TensorFlow where it is installed, else JAX where it is (``resolve_framework``)."""
FRAMEWORK_NAMES = {"tensorflow": "TensorFlow", "jax": "JAX"}
ENV_PREFIX = "TPUDASH_"
ENGINE_IDLE = "idle"
"""``Settings.engine_nice``'s default: the engine runs under Linux's SCHED_IDLE policy (``tpudash.engine.server.lower_priority``)."""
# Settings given in seconds: (lowest, highest) allowed.
SECONDS_RANGES = {
    "tpu_timeout": (1.0, 3600.0),
    "release_after": (0.0, 7 * 24 * 3600.0),
    "cancel_grace": (0.1, 60.0),
    "store_timeout": STORE_TIMEOUT_RANGE,
}


class SettingsError(ValueError):
    """A setting that is not allowed; names the flag, the variable and the rule."""


def default_runs_dir(environ: Mapping[str, str]) -> Path:
    """``$XDG_DATA_HOME/tpudash/runs``, falling back to ~/.local/share."""
    data_home = environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "tpudash" / "runs"


@dataclass(frozen=True)
class Settings:
    """Where to find the accelerator, the data and the run records.

    tpu: None for automatic detection, else a TPU name, grpc://host:port or
        'local'; an explicit value that fails is an error, never a fallback.
        'none' leaves the TPU alone (libtpu is not even loaded).
    cpu_devices: logical devices the CPU is split into when no accelerator is found.
    data_dir: tensorflow-datasets data directory (None: tfds's default).
    runs_dir: where every run is kept: a local directory (a Path), or a store's
        URL (``gs://bucket/runs``, ``s3://…``, ``memory://…``; see ``tpudash.runs.location``).
    tpu_timeout: seconds TensorFlow may take to start on a TPU, connect and
        initialize it (an unreachable gRPC address or libtpu's discovery
        otherwise hangs for minutes or for good).
    release_after: the dashboard releases the accelerator (its engine exits)
        after this many idle seconds; 0 keeps it until quit or the release key.
    cancel_grace: seconds a cancelled job has to stop before the dashboard
        ends its engine and records the run as cancelled.
    engine_nice: how the engine gives way on the CPU so the dashboard's keys
        win it over training: ``idle`` (Linux's SCHED_IDLE policy: the kernel
        runs the engine on every cycle nothing else wants and hands a core
        to a woken dashboard at once; nice 19 where there is no such policy),
        or a nice increment, 0 to 19 (a share of the CPU kept even against
        other busy processes on a shared host).
    tpu_metrics: HOST:PORT of libtpu's metrics service on this host.
    telemetry_interval: seconds between telemetry samples (0: no sampling).
    store_timeout: seconds any one call to a store (gs://, s3://) may take
        before the store counts as unreachable: a command then says so in
        one line and exits 1, a screen says since when (``tpudash.runs.storeclient``).
    framework: what the engine runs jobs on: ``tensorflow``, ``jax``, or
        ``auto`` (TensorFlow where it is installed, else JAX: ``resolve_framework``).
    """

    tpu: str | None = None
    cpu_devices: int = DEFAULT_CPU_DEVICES
    data_dir: Path | None = None
    runs_dir: Path | str | None = None
    tpu_timeout: float = 60.0
    release_after: float = 0.0
    cancel_grace: float = 2.0
    engine_nice: int | str = ENGINE_IDLE
    tpu_metrics: str = DEFAULT_TPU_METRICS_ADDRESS
    telemetry_interval: float = DEFAULT_TELEMETRY_INTERVAL_SECONDS
    store_timeout: float = DEFAULT_STORE_TIMEOUT
    framework: str = "auto"

    @classmethod
    def load(cls, flags: Mapping[str, object] | None = None, environ: Mapping[str, str] | None = None) -> Settings:
        """Merge flags (None means not given) over TPUDASH_* over defaults, validated."""
        environ = os.environ if environ is None else environ
        flags = flags or {}
        merged: dict[str, tuple[object, str]] = {}
        for item in fields(cls):
            flag_value = flags.get(item.name)
            env_value = environ.get(ENV_PREFIX + item.name.upper())
            if flag_value is not None:
                merged[item.name] = (flag_value, "--" + item.name.replace("_", "-"))
            elif env_value not in (None, ""):
                merged[item.name] = (env_value, ENV_PREFIX + item.name.upper())
        settings = cls()
        for name, (raw, source) in merged.items():
            # _convert returns the field's own type, which mypy cannot follow through a name.
            settings = replace(settings, **{name: _convert(name, raw, source)})  # type: ignore[arg-type]
        if settings.runs_dir is None:
            settings = replace(settings, runs_dir=default_runs_dir(environ))
        return settings

    def check_runs_dir(self) -> Path | str:
        """Create the runs directory if needed; SettingsError if it cannot be written (or read: a store's library)."""
        runs_dir = self.runs_dir or default_runs_dir(os.environ)
        if isinstance(runs_dir, str):
            missing = missing_library(runs_dir)
            if missing is not None:
                raise SettingsError(f"--runs-dir / TPUDASH_RUNS_DIR: {missing}")
            return runs_dir
        try:
            runs_dir.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise SettingsError(
                f"--runs-dir / TPUDASH_RUNS_DIR: cannot create {runs_dir}: {error.strerror or error}"
            ) from None
        if not os.access(runs_dir, os.W_OK | os.X_OK):
            raise SettingsError(f"--runs-dir / TPUDASH_RUNS_DIR: {runs_dir} is not writable")
        return runs_dir


def resolve_framework(choice: str, find_spec: Callable[[str], object | None] = importlib.util.find_spec) -> str:
    """``tensorflow`` or ``jax``: what an engine with ``Settings.framework`` = ``choice`` runs its jobs on.

    ``auto`` picks TensorFlow where it is installed (as before JAX could run
    jobs), else JAX where it is, else TensorFlow, whose "not installed" path
    names the fix. Nothing is imported: ``find_spec`` only looks.
    """
    if choice in ("tensorflow", "jax"):
        return choice
    if find_spec("tensorflow") is not None:
        return "tensorflow"
    if find_spec("jax") is not None:
        return "jax"
    return "tensorflow"


def settings_environment(settings: Settings, environ: dict[str, str]) -> dict[str, str]:
    """``environ`` with every setting as its TPUDASH_* variable, so a child process loads the same Settings."""
    environment = dict(environ)
    for item in fields(settings):
        value = getattr(settings, item.name)
        variable = ENV_PREFIX + item.name.upper()
        if value is None:
            environment.pop(variable, None)
        else:
            environment[variable] = str(value)
    return environment


def _convert(name: str, raw: object, source: str) -> object:
    if name == "engine_nice":
        text = str(raw).strip().lower()
        if text == ENGINE_IDLE:
            return ENGINE_IDLE
        try:
            increment = int(text, 10)
        except ValueError:
            raise SettingsError(
                f"{source}: {raw!r} is neither idle nor an integer; allowed: idle, or 0 to 19"
            ) from None
        if not 0 <= increment <= 19:
            raise SettingsError(f"{source}: {increment} is out of range; allowed: idle, or 0 to 19")
        return increment
    if name == "cpu_devices":
        try:
            count = int(str(raw).strip(), 10)
        except ValueError:
            raise SettingsError(f"{source}: {raw!r} is not an integer; allowed: 1 to {MAX_CPU_DEVICES}") from None
        if not 1 <= count <= MAX_CPU_DEVICES:
            raise SettingsError(f"{source}: {count} is out of range; allowed: 1 to {MAX_CPU_DEVICES}")
        return count
    if name == "telemetry_interval":
        low, high = TELEMETRY_INTERVAL_RANGE
        allowed = f"allowed: 0 (off) or {low:g} to {high:g} seconds"
        try:
            seconds = float(str(raw).strip())
        except ValueError:
            raise SettingsError(f"{source}: {raw!r} is not a number; {allowed}") from None
        if seconds != 0 and not low <= seconds <= high:
            raise SettingsError(f"{source}: {seconds:g} is out of range; {allowed}")
        return seconds
    if name in SECONDS_RANGES:
        low, high = SECONDS_RANGES[name]
        try:
            seconds = float(str(raw).strip())
        except ValueError:
            raise SettingsError(f"{source}: {raw!r} is not a number; allowed: {low:g} to {high:g} seconds") from None
        if not low <= seconds <= high:
            raise SettingsError(f"{source}: {seconds:g} is out of range; allowed: {low:g} to {high:g} seconds")
        return seconds
    if name == "tpu_metrics":
        try:
            return parse_metrics_address(str(raw))
        except AddressError as error:
            raise SettingsError(f"{source}: {error}") from None
    if name == "framework":
        choice = str(raw).strip().lower()
        if choice not in FRAMEWORK_CHOICES:
            raise SettingsError(f"{source}: {raw!r} is not a framework; allowed: {', '.join(FRAMEWORK_CHOICES)}")
        return choice
    if name == "tpu":
        text = str(raw).strip()
        if not text:
            raise SettingsError(f"{source}: is empty; allowed: a TPU name, grpc://host:port, 'local' or 'none'")
        return text
    if name == "runs_dir":
        try:
            location = parse_runs_dir(str(raw))
        except ValueError as error:
            raise SettingsError(f"{source}: {error}") from None
        if isinstance(location, str):
            return location
    path = Path(str(raw)).expanduser()
    if name == "data_dir" and path.exists() and not (path.is_dir() and os.access(path, os.R_OK | os.X_OK)):
        raise SettingsError(f"{source}: {path} is not a readable directory")
    blocker = _non_directory_ancestor(path)
    if blocker is not None:
        raise SettingsError(f"{source}: {path} cannot be a directory: {blocker} is a file")
    return path


def _non_directory_ancestor(path: Path) -> Path | None:
    """The first existing parent of ``path`` that is not a directory, if any."""
    for parent in path.parents:
        if parent.exists():
            return None if parent.is_dir() else parent
    return None
