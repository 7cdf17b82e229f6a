"""How a run directory is laid out: its file names, its id, its statuses, who wrote it, and atomic run.json writes.

``<runs_dir>/<UTC yyyymmdd-HHMMSS>-<job>-<6 hex>/`` holds ``events.jsonl``
(one ``jobs.events`` event per line, appended by the run's writer),
``run.json`` (its record, replaced whole) and ``telemetry.jsonl`` (samples
an observer took while the run was live). Everything that reads or writes a
run takes these names from here.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

EVENTS_FILE = "events.jsonl"
RUN_FILE = "run.json"
# Samples of the accelerator and host taken while the run was live, written
# by whoever observed it (tpudash.telemetry), never by the run's own process.
TELEMETRY_FILE = "telemetry.jsonl"
STATUS_RUNNING = "running"
STATUS_INTERRUPTED = "interrupted"
# Who wrote a run: a tpudash job, the user's model.fit with TpudashCallback,
# or the user's own loop through tpudash.record.
SOURCE_JOB = "job"
SOURCE_CALLBACK = "keras-callback"
SOURCE_RECORD = "record"


def new_run_id(job: str, now: float | None = None) -> str:
    """``20261121-025100-matmul-1a2b3c``: sortable by start time, unique."""
    stamp = datetime.fromtimestamp(now if now is not None else time.time(), tz=timezone.utc)
    return f"{stamp:%Y%m%d-%H%M%S}-{job}-{secrets.token_hex(3)}"


def write_json_atomically(path: Path, payload: dict[str, Any]) -> None:
    """Write to a temp file beside ``path``, fsync, then os.replace it.

    A write that fails (a full disk) leaves ``path`` as it was and removes
    the half-written temp file.
    """
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump(payload, handle, indent=2, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def files_key(run_dir: Path) -> tuple[str, int, int] | None:
    """What changes when a run's record changes: run.json's (else events.jsonl's) mtime and size."""
    for name in (RUN_FILE, EVENTS_FILE):
        try:
            stat = (run_dir / name).stat()
        except OSError:
            continue
        return name, stat.st_mtime_ns, stat.st_size
    return None
