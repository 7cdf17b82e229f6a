"""How a run directory is laid out: its file names, its id, its statuses, who wrote it, and atomic run.json writes.

``<runs_dir>/<UTC yyyymmdd-HHMMSS>-<job>-<6 hex>/`` holds ``events.jsonl``
(one ``jobs.events`` event per line, appended by the run's writer),
``run.json`` (its record, replaced whole) and ``telemetry.jsonl`` (samples
an observer took while the run was live). Everything that reads or writes a
run takes these names from here, but ``writer.lock`` (the writer's flock and
heartbeat), which is ``tpudash.runs.liveness``'s.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import stat
import threading
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO

from jobs.events import MAX_NAME_CHARS

# A run's two streams: appended to ``<stream>.jsonl`` locally, in segments ``<stream>/…`` in a store.
EVENTS_STREAM = "events"
TELEMETRY_STREAM = "telemetry"
EVENTS_FILE = "events.jsonl"
RUN_FILE = "run.json"
# Samples of the accelerator and host taken while the run was live, written
# by whoever observed it (tpudash.telemetry), never by the run's own process.
TELEMETRY_FILE = "telemetry.jsonl"
STATUS_RUNNING = "running"
STATUS_INTERRUPTED = "interrupted"
# A run in a store whose writers stopped beating (``liveness.store_writers_alive``): it may be
# dead, or cut off from the store; it turns ``running`` again if a heartbeat comes back.
STATUS_STALE = "stale"
# Who wrote a run: a tpudash job, the user's model.fit with TpudashCallback,
# or the user's own loop through tpudash.record.
SOURCE_JOB = "job"
SOURCE_CALLBACK = "keras-callback"
SOURCE_RECORD = "record"
# Records are small: a run.json larger than this was not written by tpudash and is not read.
MAX_RUN_FILE_BYTES = 1 << 20
# Folders of a runs directory that are not runs: ``hosts/`` holds each host agent's reports
# (``tpudash.runs.hosts``). The one definition: listing leaves them out, and every entrance that
# takes a run id (--run-id, run_id= and TPUDASH_RUN_ID, copy, the store's create and join) refuses them.
HOSTS_FOLDER = "hosts"
RESERVED_FOLDERS = frozenset({HOSTS_FOLDER})
# What a run id may be, as errors say it: one directory name inside the runs directory.
RUN_ID_RULE = (
    "a run id is the name of a directory in the runs directory (no '/', not starting with '.', "
    f"not {' or '.join(repr(name) for name in sorted(RESERVED_FOLDERS))}: that folder holds the host agents' reports)"
)


class RefusedFile(OSError):
    """A run's file that is not opened: not a regular file, a symbolic link, or too large. Its text says which."""

    def __str__(self) -> str:
        return str(self.strerror)  # the reason alone, as a user reads it: not "[Errno 22] …"


FILE_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
)


def size_words(count: int) -> str:
    """``1 MiB``, ``64 KiB``, ``100 bytes``: a cap as a refusal names it."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size and count % size == 0:
            return f"{count // size} {unit}"
    return f"{count} bytes"


def open_regular_fd(path: Path, flags: int = os.O_RDONLY, mode: int = 0o644, max_bytes: int | None = None) -> int:
    """A descriptor of ``path`` only if it is a regular file (and at most ``max_bytes``); else RefusedFile.

    ``flags``: the access wanted (``os.O_RDONLY``, ``os.O_RDWR | os.O_CREAT``, …).
    Never follows a symbolic link (O_NOFOLLOW) and never blocks on opening
    (O_NONBLOCK: a FIFO would wait for a writer forever); the type is
    checked on the open descriptor (fstat), so a file swapped in between
    cannot slip through. Other errors (a missing file) are the OSError
    ``os.open`` raised. Every file of a run, and the engine's lock, is
    opened through here.
    """
    path = Path(path)
    try:
        descriptor = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise RefusedFile(errno.ELOOP, f"{path.name}: a symbolic link, not followed") from None
        raise
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):
            kind = next((words for test, words in FILE_KINDS if test(status.st_mode)), "a special file")
            raise RefusedFile(errno.EINVAL, f"{path.name}: not a regular file ({kind})")
        if max_bytes is not None and status.st_size > max_bytes:
            raise RefusedFile(errno.EFBIG, f"{path.name}: larger than {size_words(max_bytes)}")
        # Back to blocking I/O: a regular file never waits, and buffered readers expect it.
        os.set_blocking(descriptor, True)
        return descriptor
    except BaseException:
        os.close(descriptor)
        raise


def open_regular(path: Path, max_bytes: int | None = None) -> BinaryIO:
    """``path`` opened for reading only if it is a regular file (see ``open_regular_fd``); else RefusedFile."""
    return os.fdopen(open_regular_fd(path, max_bytes=max_bytes), "rb")


def read_run_file(run_dir: Path) -> Any:
    """run.json parsed (any JSON value); RefusedFile or OSError when it cannot be read, ValueError when not JSON."""
    with open_regular(run_dir / RUN_FILE, MAX_RUN_FILE_BYTES) as handle:
        # One byte past the cap: a file that grew after the fstat is still refused.
        data = handle.read(MAX_RUN_FILE_BYTES + 1)
    if len(data) > MAX_RUN_FILE_BYTES:
        raise RefusedFile(errno.EFBIG, f"{RUN_FILE}: larger than {size_words(MAX_RUN_FILE_BYTES)}")
    return parse_run_file(data)


def parse_run_file(data: bytes) -> Any:
    """run.json's bytes as JSON (any value); ValueError when they are not JSON."""
    try:
        return json.loads(data.decode("utf-8"))
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None


def is_reserved_name(name: str) -> bool:
    """Whether ``name`` is a folder of the runs directory that is not a run (``hosts``), in any case.

    Any case: on a disk that does not tell cases apart (macOS, Windows) ``HOSTS`` is the same folder.
    """
    return name.casefold() in RESERVED_FOLDERS


def is_run_id(run_id: str) -> bool:
    """Whether ``run_id`` may name a run: a plain directory name, never ``..``, a hidden one or a reserved one."""
    return (
        bool(run_id)
        and not run_id.startswith(".")
        and not is_reserved_name(run_id)
        and "/" not in run_id
        and os.sep not in run_id
        and (os.altsep is None or os.altsep not in run_id)
        and "\0" not in run_id
    )


def checked_run_id(run_id: object, field: str | None = "run_id") -> str:
    """``run_id`` if a run may take it, else ValueError naming ``field`` (if any) and what it may be (never ``hosts``)."""
    if not isinstance(run_id, str) or not is_run_id(run_id):
        why = "is reserved" if isinstance(run_id, str) and is_reserved_name(run_id) else "cannot name a run"
        raise ValueError(f"{f'{field}: ' if field else ''}{run_id!r:.80} {why}; allowed: {RUN_ID_RULE}")
    return run_id


def new_run_id(job: str, now: float | None = None) -> str:
    """``20261121-025100-matmul-1a2b3c``: sortable by start time, unique."""
    stamp = datetime.fromtimestamp(now if now is not None else time.time(), tz=timezone.utc)
    return f"{stamp:%Y%m%d-%H%M%S}-{job}-{secrets.token_hex(3)}"


def readable_run_name(job: str, params: Mapping[str, Any]) -> str:
    """``train mnist mnist-cnn``: the job, then the values of the params that tell its runs apart.

    Which params those are is the job's (``JobSpec.name_params``); a job
    tpudash does not ship (the user's own training) is named by itself. Runs
    recorded before runs had names get theirs the same way, from run.json.
    """
    from jobs import registry

    spec = registry().get(job)
    values = [params[name] for name in spec.name_params if name in params] if spec is not None else []
    return " ".join([job, *(str(value) for value in values)])[:MAX_NAME_CHARS]


def record_bytes(payload: dict[str, Any]) -> bytes:
    """run.json's bytes, as every writer writes them (to a disk or a store)."""
    return json.dumps(payload, indent=2, sort_keys=True).encode("utf-8")


def write_json_atomically(path: Path, payload: dict[str, Any]) -> None:
    """run.json (or any record) written whole: see ``write_bytes_atomically``."""
    write_bytes_atomically(path, record_bytes(payload))


def write_bytes_atomically(path: Path, data: bytes) -> None:
    """Write to a temp file beside ``path``, fsync, then os.replace it.

    A write that fails (a full disk) leaves ``path`` as it was and removes
    the half-written temp file.
    """
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(temporary, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
