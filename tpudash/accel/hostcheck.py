"""What this host offers TensorFlow, found without importing TensorFlow.

A TPU host punishes a wrong install at ``import tensorflow``: the CPU build
cannot see the chips ("No OpKernel … ConfigureDistributedTPU … [CPU]"), a
libtpu that does not match tensorflow-tpu aborts the process, and libtpu
admits one process per host. So before anything imports TensorFlow, tpudash
looks at:

- the chips, through tpu-info's PCI scan (Google vendor id 0x1ae0; a
  ``/dev/vfio`` node alone is no proof of a TPU),
- the installed TensorFlow and libtpu distributions (package metadata),
- the process that holds the chips (open ``/dev/accel*``, ``/dev/vfio/N``
  or libtpu's lockfile), and the framework it runs (JAX, TensorFlow,
  PyTorch/XLA), read from the libraries it has loaded (``/proc/PID/maps``),

and turns what it finds into diagnoses: one line each, ending with the fix.
The same report gives the one install line that fits this host.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

# The TensorFlow builds tpudash installs, as pinned in pyproject.toml's
# [cpu] and [tpu] extras (a unit test keeps the two in step).
CPU_BUILD = ("tensorflow>=2.20,<2.22",)
# tensorflow-tpu → the libtpu release it works with. Measured here: libtpu
# 0.0.14–0.0.30 load with tensorflow-tpu 2.20.0, 0.0.40 and later abort it
# ("… not available in this library"), 0.0.21 and later block on the cloud
# metadata server off Google Cloud; 0.0.17 is what Kaggle's TF 2.20 TPU image
# ships. README, "On a TPU", says where the pairing comes from.
TPU_BUILD_PAIRS = {"2.20.0": "0.0.17"}
TPU_BUILD = ("tensorflow-tpu==2.20.0", "libtpu==0.0.17")

# Distributions that install the ``tensorflow`` module, and which of them can
# drive local TPU chips.
TENSORFLOW_DISTRIBUTIONS = (
    "tensorflow",
    "tensorflow-cpu",
    "tensorflow-tpu",
    "tensorflow-intel",
    "tensorflow-macos",
    "tf-nightly",
    "tf-nightly-cpu",
    "tf-nightly-tpu",
)
TPU_TENSORFLOW_DISTRIBUTIONS = ("tensorflow-tpu", "tf-nightly-tpu")
LIBTPU_DISTRIBUTIONS = ("libtpu", "libtpu-nightly")
# JAX's TPU install brings a libtpu of its own, which the TPU build of TensorFlow would replace.
JAX_DISTRIBUTIONS = ("jax",)
LIBTPU_LOCKFILE = "/tmp/libtpu_lockfile"
TPU_DEVICE_PATTERN = re.compile(r"/dev/(?:accel\d+|vfio/\d+)")
# A holder's framework, by the shared libraries it has mapped, most specific
# first (a process that loaded two is named by the first found here). Matched
# on path parts, never a bare word: a virtualenv may be called "venv-jax".
FRAMEWORK_LIBRARIES = (
    ("PyTorch/XLA", re.compile(r"/torch_xla/|/_XLAC[.\w-]*\.so")),
    ("JAX", re.compile(r"/jaxlib/|/jax_plugins/|/xla_extension[.\w-]*\.so|/libjax_\w+\.so")),
    ("TensorFlow", re.compile(r"/_pywrap_tensorflow\w*\.so|/libtensorflow\w*\.so")),
)
MAPS_READ_LIMIT = 8 * 1024 * 1024
"""The most of a holder's /proc/PID/maps read (a TensorFlow process maps ~1 MiB of lines)."""
# tpudash's own processes that may hold the TPU: its engine (another dashboard's,
# met through the engine lock), and the short-lived probes an engine or a dashboard runs.
TPUDASH_MODULES = re.compile(r"(?:^|\s)-m\s+tpudash\.(?:engine|accel\.tpuprobe|telemetry\.tensorcore)(?:\s|$)")


@dataclass(frozen=True)
class Chips:
    """The TPU chips on this host's PCI bus, per tpu-info's scan."""

    chip_type: str | None = None
    count: int = 0
    hbm_gib_per_chip: int | None = None
    cores_per_chip: int | None = None
    scan_error: str | None = None
    """Why the scan could not run (tpu-info missing, sysfs unreadable); None when it ran."""

    def describe(self) -> str:
        if self.scan_error:
            return f"unknown ({self.scan_error})"
        if not self.count:
            return "none (no PCI device of Google's vendor id 0x1ae0)"
        cores = f", {self.cores_per_chip} TensorCore(s) each" if self.cores_per_chip else ""
        return f"{self.count} × {self.chip_type}, {self.hbm_gib_per_chip} GiB HBM each{cores}"


@dataclass(frozen=True)
class TpuHolder:
    """A process that has the TPU open."""

    pid: int
    command: str
    paths: tuple[str, ...]
    framework: str = ""
    """"JAX", "TensorFlow", "PyTorch/XLA" (from the libraries it loaded), or "" when unknown."""

    def describe(self) -> str:
        """``the JAX process pid 1234 (python train.py)``; ``pid 1234 (…)`` when its framework is unknown."""
        process = f"the {self.framework} process pid {self.pid}" if self.framework else f"pid {self.pid}"
        return f"{process} ({self.command or 'command line unreadable'})"

    @property
    def from_tpudash(self) -> bool:
        """An engine of tpudash's (another dashboard's: its engine lock names it) or one of its probes."""
        return TPUDASH_MODULES.search(self.command) is not None


@dataclass(frozen=True)
class Diagnosis:
    """One thing wrong with this host for TensorFlow: a line that ends with its fix.

    ``blocks_tpu``: the TPU cannot be used as things stand (tpudash runs jobs
    on the CPU default instead, or refuses an explicit ``--tpu``).
    ``blocks_tensorflow``: importing TensorFlow would fail or abort, so tpudash
    does not try.
    """

    code: str
    message: str
    blocks_tpu: bool = False
    blocks_tensorflow: bool = False


@dataclass
class HostCheck:
    """Everything found before TensorFlow is imported."""

    chips: Chips
    distributions: dict[str, str] = field(default_factory=dict)
    holders: list[TpuHolder] = field(default_factory=list)
    tensorflow_found: bool = False
    """A tensorflow module exists (with or without package metadata)."""
    diagnoses: list[Diagnosis] = field(default_factory=list)
    jax_found: bool = False
    """A jax module exists: the engine can run jobs on JAX (``Settings.framework``)."""

    @property
    def tensorflow_build(self) -> str | None:
        """``tensorflow-tpu 2.20.0``: the distribution(s) that provide the tensorflow module."""
        builds = [
            f"{name} {self.distributions[name]}" for name in TENSORFLOW_DISTRIBUTIONS if name in self.distributions
        ]
        return " + ".join(builds) or None

    @property
    def install_line(self) -> str:
        """The line that installs the TensorFlow build this host needs."""
        return install_line("tpu" if self.chips.count else "cpu")

    def blocking(self, *, tpu: bool = False, tensorflow: bool = False) -> list[Diagnosis]:
        return [item for item in self.diagnoses if (tpu and item.blocks_tpu) or (tensorflow and item.blocks_tensorflow)]

    def to_dict(self) -> dict:
        data = asdict(self)
        data["tensorflow_build"] = self.tensorflow_build
        data["install_line"] = self.install_line
        data["jax_install_line"] = jax_install_line("tpu" if self.chips.count else "cpu")
        return data


def install_line(kind: str) -> str:
    """``pip install "tensorflow-tpu==2.20.0" "libtpu==0.0.17"`` for kind 'tpu', the CPU build for 'cpu'."""
    requirements = TPU_BUILD if kind == "tpu" else CPU_BUILD
    return "pip install " + " ".join(f'"{requirement}"' for requirement in requirements)


def jax_install_line(kind: str) -> str:
    """The line that installs JAX with Keras for tpudash's jobs: JAX's TPU build for kind 'tpu', the CPU's otherwise."""
    jax = '"jax[tpu]"' if kind == "tpu" else '"jax[cpu]>=0.10.2,<0.11"'
    return f'pip install {jax} "keras>=3.15,<4"'


# -- the seams: each reads one part of the environment -----------------------------------


def scan_chips() -> Chips:
    """Ask tpu-info's PCI scan what TPU chips this host has."""
    try:
        from tpu_info import device
    except ImportError as error:
        return Chips(scan_error=f"tpu-info is not importable ({error}); pip install tpu-info")
    try:
        chip_type, count = device.get_local_chips()
    except (OSError, AssertionError, ValueError) as error:
        return Chips(scan_error=f"the PCI scan failed: {type(error).__name__}: {error}")
    if chip_type is None or not count:
        return Chips()
    info = chip_type.value
    return Chips(
        chip_type=str(chip_type),
        count=int(count),
        hbm_gib_per_chip=int(info.hbm_gib),
        cores_per_chip=int(info.devices_per_chip),
    )


def installed_distributions(version_of: Callable[[str], str] = importlib.metadata.version) -> dict[str, str]:
    """The TensorFlow, libtpu and JAX distributions installed, by name → version."""
    found = {}
    for name in TENSORFLOW_DISTRIBUTIONS + LIBTPU_DISTRIBUTIONS + JAX_DISTRIBUTIONS:
        try:
            found[name] = version_of(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def find_tpu_holders(proc_root: str | os.PathLike = "/proc", own_pid: int | None = None) -> list[TpuHolder]:
    """Processes with a TPU device or libtpu's lockfile open (other than this one), with the framework each runs."""
    own_pid = os.getpid() if own_pid is None else own_pid
    root = Path(proc_root)
    holders = []
    try:
        process_dirs = [entry for entry in root.iterdir() if entry.name.isdigit()]
    except OSError:
        return []
    for process_dir in process_dirs:
        pid = int(process_dir.name)
        if pid == own_pid:
            continue
        try:
            links = list((process_dir / "fd").iterdir())
        except OSError:  # gone, or another user's process
            continue
        paths = set()
        for link in links:
            try:
                target = os.readlink(link)
            except OSError:
                continue
            if TPU_DEVICE_PATTERN.fullmatch(target) or target == LIBTPU_LOCKFILE:
                paths.add(target)
        if paths:
            holders.append(
                TpuHolder(
                    pid=pid,
                    command=_command_line(process_dir),
                    paths=tuple(sorted(paths)),
                    framework=loaded_framework(process_dir),
                )
            )
    return sorted(holders, key=lambda holder: holder.pid)


def loaded_framework(process_dir: Path, limit: int = MAPS_READ_LIMIT) -> str:
    """The framework whose libraries the process has mapped ("JAX", "TensorFlow", "PyTorch/XLA"), or "".

    Reads at most ``limit`` bytes of its maps; a process that is gone, or
    another user's (maps needs ptrace access), is "".
    """
    found: set[str] = set()
    read = 0
    try:
        with open(process_dir / "maps", "rb") as maps:
            for raw in maps:
                read += len(raw)
                if read > limit:
                    break
                if b"/" not in raw:
                    continue  # anonymous memory, the heap, the stack
                line = raw.decode("utf-8", "replace")
                found.update(name for name, pattern in FRAMEWORK_LIBRARIES if pattern.search(line))
                if "PyTorch/XLA" in found:
                    break  # nothing outranks it
    except OSError:
        return ""
    return next((name for name, _ in FRAMEWORK_LIBRARIES if name in found), "")


def foreign_holder(host_check: Mapping) -> TpuHolder | None:
    """The first process in ``host_check`` (``HostCheck.to_dict()``) holding the TPU that is not tpudash's own."""
    for item in host_check.get("holders") or ():
        holder = TpuHolder(
            pid=int(item["pid"]),
            command=str(item.get("command", "")),
            paths=tuple(item.get("paths", ())),
            framework=str(item.get("framework", "")),
        )
        if not holder.from_tpudash:
            return holder
    return None


def _command_line(process_dir: Path) -> str:
    try:
        raw = (process_dir / "cmdline").read_bytes()
    except OSError:
        return ""
    return " ".join(part.decode("utf-8", "replace") for part in raw.split(b"\0") if part)[:200]


# -- the diagnoses ------------------------------------------------------------------------


def diagnose(
    chips: Chips, distributions: Mapping[str, str], holders: list[TpuHolder], tensorflow_found: bool | None = None
) -> list[Diagnosis]:
    """Every problem the facts show, most fundamental first.

    ``tensorflow_found``: whether a tensorflow module exists at all (a build
    without package metadata counts); by default, whether a distribution does.
    """
    found: list[Diagnosis] = []
    builds = [name for name in TENSORFLOW_DISTRIBUTIONS if name in distributions]
    tpu_builds = [name for name in builds if name in TPU_TENSORFLOW_DISTRIBUTIONS]
    chips_text = f"{chips.count} {chips.chip_type}{'s' if chips.count > 1 else ''}" if chips.count else ""
    if tensorflow_found is None:
        tensorflow_found = bool(builds)

    if not tensorflow_found:
        kind = "TPU" if chips.count else "CPU/GPU"
        where = f" for this host's {chips_text}" if chips.count else ""
        how = install_line("tpu" if chips.count else "cpu")
        jax_libtpu = _jax_libtpu(distributions) if chips.count else None
        if jax_libtpu is not None:
            # Colab's TPU runtime, a JAX TPU VM: the pinned libtpu would replace JAX's and break it.
            how = (
                f"JAX uses {jax_libtpu} here, which that build's libtpu would replace, so give TensorFlow a "
                f'virtual environment of its own: python3 -m venv ~/tpudash-tf && ~/tpudash-tf/bin/pip install "./tpudash[tpu]"'
            )
        found.append(
            Diagnosis(
                "no-tensorflow",
                f"TensorFlow is not installed; the dashboard, history, `tpudash runs` and watching your own training "
                f"work without it, jobs need the {kind} build{where}: {how}",
                blocks_tpu=True,
                blocks_tensorflow=True,
            )
        )
        return found

    if chips.count and builds and not tpu_builds:
        installed = ", ".join(f"{name} {distributions[name]}" for name in builds)
        found.append(
            Diagnosis(
                "cpu-build-on-tpu-host",
                f"this host has {chips_text} but the CPU build of TensorFlow is installed ({installed}), which cannot "
                f'drive them ("No OpKernel … ConfigureDistributedTPU … [CPU]"): '
                f"pip uninstall -y {' '.join(builds)} && {install_line('tpu')}",
                blocks_tpu=True,
            )
        )

    if len(builds) > 1:
        installed = ", ".join(f"{name} {distributions[name]}" for name in builds)
        found.append(
            Diagnosis(
                "several-tensorflow-builds",
                f"{installed} are installed together and overwrite each other's files: "
                f"pip uninstall -y {' '.join(builds)} && {install_line('tpu' if chips.count else 'cpu')}",
            )
        )

    for name in tpu_builds:
        found.extend(_libtpu_pairing(name, distributions[name], distributions, chips))

    if holders and chips.count:
        holder = holders[0]
        others = f" (and {len(holders) - 1} more)" if len(holders) > 1 else ""
        found.append(
            Diagnosis(
                "tpu-held",
                f"the TPU is held by {holder.describe()}{others} through {', '.join(holder.paths)}; libtpu admits one "
                f"process per host, so jobs run on the CPU default: release the TPU in that process (or end it), "
                f"then re-initialise",
                blocks_tpu=True,
            )
        )
    return found


def _jax_libtpu(distributions: Mapping[str, str]) -> str | None:
    """``libtpu 0.0.30`` when JAX is installed with a libtpu that is not the TPU build's; else None."""
    if not any(name in distributions for name in JAX_DISTRIBUTIONS):
        return None
    wanted = dict(requirement.split("==") for requirement in TPU_BUILD)
    libtpu = next(((name, distributions[name]) for name in LIBTPU_DISTRIBUTIONS if name in distributions), None)
    if libtpu is None or libtpu[1] == wanted.get(libtpu[0]):
        return None
    return f"{libtpu[0]} {libtpu[1]}"


def _libtpu_pairing(build: str, version: str, distributions: Mapping[str, str], chips: Chips) -> list[Diagnosis]:
    """tensorflow-tpu and libtpu must be the pair they were built as; a wrong libtpu aborts the import."""
    libtpu = next(((name, distributions[name]) for name in LIBTPU_DISTRIBUTIONS if name in distributions), None)
    wanted = TPU_BUILD_PAIRS.get(version) if build == "tensorflow-tpu" else None
    # Off a TPU host tpudash keeps libtpu from loading (TPU_LOAD_LIBRARY=0), so a
    # bad pairing cannot abort anything: it is worth a line, not a refusal.
    fatal = bool(chips.count)
    if wanted is None:
        known = ", ".join(f"tensorflow-tpu {tf} with libtpu {lib}" for tf, lib in TPU_BUILD_PAIRS.items())
        return [
            Diagnosis(
                "unknown-tpu-build",
                f"tpudash was tested with {known}, not {build} {version}{' and libtpu ' + libtpu[1] if libtpu else ''}; "
                f"if TensorFlow aborts at import, install the tested pair: {install_line('tpu')}",
            )
        ]
    if libtpu is None:
        return [
            Diagnosis(
                "libtpu-missing",
                f'{build} {version} needs libtpu {wanted}, which is not installed: pip install "libtpu=={wanted}"',
                blocks_tpu=True,
            )
        ]
    if libtpu[1] != wanted:
        return [
            Diagnosis(
                "libtpu-mismatch",
                f"{build} {version} works with libtpu {wanted}, but {libtpu[0]} {libtpu[1]} is installed "
                f'(TensorFlow aborts at import with it): pip install "libtpu=={wanted}"',
                blocks_tpu=True,
                blocks_tensorflow=fatal,
            )
        ]
    return []


def inspect(
    chip_scan: Callable[[], Chips] = scan_chips,
    distributions: Callable[[], dict[str, str]] = installed_distributions,
    holders: Callable[[], list[TpuHolder]] = find_tpu_holders,
) -> HostCheck:
    """Scan the host (a few milliseconds; no TensorFlow import) and diagnose it."""
    chips = chip_scan()
    installed = distributions()
    holding = holders() if chips.count else []
    found = any(name in installed for name in TENSORFLOW_DISTRIBUTIONS) or tensorflow_importable()
    return HostCheck(
        chips=chips,
        distributions=installed,
        holders=holding,
        tensorflow_found=found,
        diagnoses=diagnose(chips, installed, holding, tensorflow_found=found),
        jax_found=jax_importable(),
    )


def host_lines(host_check: dict, framework: str = "tensorflow") -> list[tuple[str, str, str]]:
    """(label, text, style) lines for what the host scan found, shared by the CLI and the Devices screen.

    ``framework``: what the engine runs jobs on; on ``jax`` a missing TensorFlow is no problem (its line says so).
    """
    chips = Chips(**host_check["chips"])
    libtpu = ", ".join(
        f"{name} {version}" for name, version in host_check["distributions"].items() if name.startswith("libtpu")
    )
    build = host_check.get("tensorflow_build") or (
        "found, without package metadata" if host_check.get("tensorflow_found") else "not installed"
    )
    lines = [("TPU chips", chips.describe(), ""), ("TensorFlow build", build + (f" · {libtpu}" if libtpu else ""), "")]
    if host_check.get("jax_found"):
        jax = host_check["distributions"].get("jax")
        lines.append(
            ("JAX", (jax or "installed") + (" · the engine runs jobs on it" if framework == "jax" else ""), "")
        )
    for holder in host_check.get("holders", []):
        described = TpuHolder(holder["pid"], holder["command"], (), holder.get("framework", "")).describe()
        lines.append(("TPU held by", f"{described} via {', '.join(holder['paths'])}", "yellow"))
    for diagnosis in host_check.get("diagnoses", []):
        if framework == "jax" and diagnosis["code"] == "no-tensorflow":
            continue  # jobs run on JAX: a missing TensorFlow stops nothing
        lines.append(
            (
                "problem" if diagnosis["blocks_tpu"] or diagnosis["blocks_tensorflow"] else "warning",
                diagnosis["message"],
                "bold red" if diagnosis["blocks_tensorflow"] else "yellow",
            )
        )
    return lines


def jax_importable() -> bool:
    """Whether a ``jax`` module can be found (without importing it: importing JAX takes the TPU)."""
    return importlib.util.find_spec("jax") is not None


def tensorflow_importable() -> bool:
    """Whether a ``tensorflow`` module can be found (without importing it)."""
    return importlib.util.find_spec("tensorflow") is not None
