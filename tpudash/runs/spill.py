"""A store run's directory on this host: where it is, what in it is a writer's spill, and clearing it at the finish.

A run written into a store keeps a local directory (``local_run_dir``,
under ``default_spill_dir``): segments the store has not taken yet are
spilled there laid out as a run (``SegmentWriter``), and the job and its
observers write their own files there (TensorBoard logs, the telemetry
sampled on this host). At the finish the job's files are uploaded
(``upload_artifacts``) and the emptied directory goes (``forget_local_dir``);
what the store did not take stays, for ``tpudash copy``.
"""

from __future__ import annotations

import os
from pathlib import Path

from tpudash.runs.backends import RunFiles
from tpudash.runs.layout import EVENTS_STREAM, RUN_FILE, TELEMETRY_STREAM
from tpudash.runs.liveness import WRITERS_FOLDER
from tpudash.runs.workers import is_worker_stream

# What in a run's local directory is the writers' own (spilled segments, the record), not the job's files
# (TensorBoard logs): the telemetry's segments are its writer's (``tpudash.telemetry.recorder``), and
# the ``worker-<index>`` streams other workers on this host spilled (``tpudash.runs.worker_recorder``).
SPILLED = (EVENTS_STREAM, TELEMETRY_STREAM, RUN_FILE, WRITERS_FOLDER)


def is_spilled(relative: str) -> bool:
    """Whether a file of a run's local directory is a writer's own (a spilled segment, the record), not the job's."""
    first = relative.split("/")[0]
    return first in SPILLED or is_worker_stream(first)


def default_spill_dir(environ: dict[str, str] | None = None) -> Path:
    """``$XDG_CACHE_HOME/tpudash/unsent``: runs (or parts of runs) a store did not take yet, laid out as runs."""
    environ = dict(os.environ) if environ is None else environ
    cache_home = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache_home) / "tpudash" / "unsent"


def local_run_dir(spill_root: Path | None, run_id: str) -> Path:
    """A store run's directory on this host: its spill, and the files its job and observers write locally."""
    return (spill_root or default_spill_dir()) / run_id


def upload_artifacts(files: RunFiles, run_dir: Path) -> None:
    """The job's own files in ``run_dir`` (TensorBoard logs, telemetry) into the run.

    Each is removed locally once it is in the store, so what stays is what still has to go.
    """
    for path in sorted(run_dir.rglob("*")):
        relative = path.relative_to(run_dir).as_posix()
        if not path.is_file() or path.is_symlink() or is_spilled(relative):
            continue
        files.write(relative, path.read_bytes())
        path.unlink(missing_ok=True)


def forget_local_dir(run_dir: Path) -> None:
    """The store has it all: the run's local directory goes (empty folders first)."""
    for folder in sorted((path for path in run_dir.rglob("*") if path.is_dir()), reverse=True):
        try:
            folder.rmdir()
        except OSError:
            pass
    try:
        run_dir.rmdir()
    except OSError:
        pass
