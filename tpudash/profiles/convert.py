"""A capture to its summary: XProf run in a child process with a time bound (the parent's side, no xprof here).

``convert_capture`` runs ``python -m tpudash.profiles.xprof_child <capture_dir>``
(xprof is heavy, logs from C++ to stderr, and may crash or hang on a bad
capture: none of that may reach the dashboard's process), waits at most its
timeout, and reads back the ``summary.json`` the child wrote. Every failure is a
``ProfileError`` whose text is the one sentence the user reads: xprof missing
(the install line), a timeout, a crash (its exit status and last stderr lines),
a capture folder with no ``*.xplane.pb``.

``summarize_run_capture`` does it for a run's capture wherever the run is: a
local run's capture is converted in place; a bucket run's is downloaded into a
cache folder, converted there, and its summary.json uploaded beside the capture.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from tpudash.profiles.summary import (
    SUMMARY_FILE,
    XPLANE_SUFFIX,
    ProfileError,
    ProfileSummary,
    capture_folder,
    read_summary,
)
from tpudash.runs.backends import RunFiles

__all__ = [
    "PROFILE_EXTRA_INSTALL",
    "ProfileError",
    "convert_capture",
    "summarize_run_capture",
    "xprof_available",
]

PROFILE_EXTRA_INSTALL = 'pip install "tpudash[profile]"'
CHILD_MODULE = "tpudash.profiles.xprof_child"
EXIT_NO_XPROF = 3  # xprof_child's statuses (that module imports xprof, so they are repeated here)
EXIT_NO_XPLANE = 4
STDERR_LINES_SHOWN = 3
MAX_XPLANE_BYTES = 2 * 1024**3
# XProf's C++ INFO/WARNING lines (glog's "I0000 00:00:…"): noise next to the line that says what broke.
GLOG_CHATTER = re.compile(r"^([IW]\d{4} |WARNING: All log messages before absl::InitializeLog)")


def xprof_available() -> bool:
    """Whether xprof can be imported here (found, not imported: it is heavy)."""
    try:
        return importlib.util.find_spec("xprof") is not None
    except (ImportError, ValueError):
        return False


def no_xprof_sentence() -> str:
    return f"reading a profile needs xprof: {PROFILE_EXTRA_INSTALL}"


def convert_capture(
    capture_dir: Path,
    *,
    timeout: float = 120.0,
    framework: str | None = None,
    env: Mapping[str, str] | None = None,
) -> ProfileSummary:
    """Convert the capture in ``capture_dir`` (its summary.json written beside it) and return its summary.

    ``framework`` (when the run's answer says it) is written into the summary
    rather than guessed; ``env`` replaces the child's environment (tests).
    Raises ProfileError with the sentence the user reads.
    """
    capture_dir = Path(capture_dir)
    if not xprof_available():
        raise ProfileError(no_xprof_sentence())
    if not capture_dir.is_dir() or not any(capture_dir.glob(f"*{XPLANE_SUFFIX}")):
        raise ProfileError(f"capture {capture_dir.name} holds no {XPLANE_SUFFIX} file: there is nothing to convert")
    command = [sys.executable, "-m", CHILD_MODULE, str(capture_dir), "--parent", str(os.getpid())]
    if framework in ("tensorflow", "jax"):
        command += ["--framework", framework]
    child = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        encoding="utf-8",
        errors="replace",
        env=dict(env) if env is not None else None,
    )
    try:
        _, stderr = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        raise ProfileError(
            f"converting capture {capture_dir.name} took longer than {timeout:g} s; the converter was stopped "
            "(a longer --timeout, or fewer steps, may do)"
        ) from None
    if child.returncode == EXIT_NO_XPROF:
        raise ProfileError(no_xprof_sentence())
    if child.returncode == EXIT_NO_XPLANE:
        raise ProfileError(f"capture {capture_dir.name} holds no {XPLANE_SUFFIX} file: there is nothing to convert")
    if child.returncode != 0:
        raise ProfileError(
            f"capture {capture_dir.name}: the converter failed (exit {child.returncode}): {last_lines(stderr)}"
        )
    try:
        return ProfileSummary.from_bytes((capture_dir / SUMMARY_FILE).read_bytes())
    except (OSError, ValueError) as error:
        raise ProfileError(f"the converter's summary of capture {capture_dir.name} cannot be read: {error}") from None


def last_lines(stderr: str, count: int = STDERR_LINES_SHOWN) -> str:
    """The last ``count`` lines the child wrote that say something (XProf's INFO chatter left out), joined by " | "."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    telling = [line for line in lines if not GLOG_CHATTER.match(line)] or lines
    return " | ".join(line[:300] for line in telling[-count:]) or "it wrote nothing on stderr"


def answered_framework(files: RunFiles, capture: str) -> str | None:
    """The framework the run's writer said it profiled ``capture`` with (its answer); None when no answer says."""
    from tpudash.profiles.requests import read_answers

    try:
        answers = read_answers(files)
    except (OSError, ValueError):
        return None
    return next((answer.framework for answer in answers if answer.capture == capture), None)


def summarize_run_capture(
    files: RunFiles, capture: str, *, cache_root: Path, timeout: float = 120.0, framework: str | None = None
) -> ProfileSummary:
    """The summary of a run's capture: its summary.json when present and valid, else converted now.

    A local run's capture is converted in place. A bucket run's files are
    downloaded to ``cache_root/<capture>/`` (kept there: a second look reads
    summary.json from the bucket anyway), converted, and the summary.json
    uploaded beside the capture. Raises ProfileError with the user's sentence.
    """
    folder = capture_folder(capture)  # ValueError for a name that is not a plain name
    try:
        existing = read_summary(files, capture)
    except ProfileError:
        existing = None  # a summary this tpudash cannot read: converted again, replacing it
    if existing is not None:
        return existing
    framework = framework or answered_framework(files, capture)
    local = files.local_dir
    if local is not None:
        return convert_capture(local / folder, timeout=timeout, framework=framework)
    names = [name for name in files.list(folder) if name.endswith(XPLANE_SUFFIX)]
    if not names:
        raise ProfileError(f"capture {capture} holds no {XPLANE_SUFFIX} file: there is nothing to convert")
    target = Path(cache_root) / capture
    target.mkdir(parents=True, exist_ok=True)
    for name in names:
        try:
            data = files.read(f"{folder}/{name}", MAX_XPLANE_BYTES)
        except OSError as error:
            raise ProfileError(f"capture {capture} could not be downloaded from {files.where}: {error}") from None
        partial = target / f".{name}.{os.getpid()}"
        partial.write_bytes(data)
        os.replace(partial, target / name)
    summary = convert_capture(target, timeout=timeout, framework=framework)
    try:
        files.write(f"{folder}/{SUMMARY_FILE}", (target / SUMMARY_FILE).read_bytes())
    except OSError as error:
        raise ProfileError(
            f"capture {capture} was converted but its summary could not be uploaded to {files.where}: {error}"
        ) from None
    return summary
