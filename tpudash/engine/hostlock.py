"""At most one engine per host holds the accelerator: an flock on a lock file, taken before TensorFlow is imported.

A TPU host admits one process to its chips. A second dashboard (another tab
of ``tpudash serve``, another terminal) that started an engine of its own
would get an engine that cannot open them, and a confusing fallback to CPU.
So an engine takes ``EngineLock`` (``flock(LOCK_EX | LOCK_NB)``) first thing,
before anything imports TensorFlow, and keeps it for its lifetime; the
kernel drops it when the engine exits, however it exits. The lock file says
who holds it (``LockHolder``: the engine's pid, its dashboard's pid, the
user, since when), so the engine that cannot take it names the holder and
exits, and its dashboard watches (``tpudash.engine.protocol.AcceleratorHeld``).

Where: ``$TPUDASH_ENGINE_LOCK`` (tests isolate themselves with it), else
``$XDG_RUNTIME_DIR/tpudash/engine.lock``, else ``<tmp>/tpudash-<uid>/engine.lock``.
The lock is per user: libtpu's own lock (``/tmp/libtpu_lockfile``) still
keeps another user's process off the chips.
"""

from __future__ import annotations

import fcntl
import getpass
import json
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tpudash.runs.layout import open_regular_fd

LOCK_VARIABLE = "TPUDASH_ENGINE_LOCK"
LOCK_FILE = "engine.lock"
HOLDER_TEXT_LIMIT = 4096
"""The most of a lock file read for its holder: what is in it is a hint, never trusted further."""


def engine_lock_path(environ: Mapping[str, str] = os.environ) -> Path:
    """This user's engine lock file on this host (see the module's docstring)."""
    override = environ.get(LOCK_VARIABLE)
    if override:
        return Path(override)
    runtime_dir = environ.get("XDG_RUNTIME_DIR")
    if runtime_dir and os.path.isdir(runtime_dir):
        return Path(runtime_dir) / "tpudash" / LOCK_FILE
    return Path(tempfile.gettempdir()) / f"tpudash-{os.getuid()}" / LOCK_FILE


@dataclass(frozen=True)
class LockHolder:
    """Who holds the lock, as its file says: a hint for the message, since the file is anyone's to write."""

    engine_pid: int | None = None
    dashboard_pid: int | None = None
    user: str = ""
    since: int | None = None
    """Wall-clock seconds the engine took the lock."""

    def describe(self) -> str:
        """``tpudash engine pid N (dashboard pid M, user U, since HH:MM)``, leaving out what is not known."""
        who = f"tpudash engine pid {self.engine_pid}" if self.engine_pid is not None else "another tpudash engine"
        details = []
        if self.dashboard_pid is not None:
            details.append(f"dashboard pid {self.dashboard_pid}")
        if self.user:
            details.append(f"user {self.user}")
        if self.since is not None:
            details.append(f"since {time.strftime('%H:%M', time.localtime(self.since))}")
        return f"{who} ({', '.join(details)})" if details else who

    def to_text(self) -> str:
        return json.dumps(
            {"engine_pid": self.engine_pid, "dashboard_pid": self.dashboard_pid, "user": self.user, "since": self.since}
        )

    @classmethod
    def from_text(cls, text: str) -> LockHolder:
        """The holder a lock file names; what is missing or of the wrong type is left unknown."""
        try:
            payload = json.loads(text)
        except (ValueError, RecursionError):
            return cls()
        if not isinstance(payload, dict):
            return cls()

        def pid(value: object) -> int | None:
            return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**22 else None

        since = payload.get("since")
        user = payload.get("user")
        return cls(
            engine_pid=pid(payload.get("engine_pid")),
            dashboard_pid=pid(payload.get("dashboard_pid")),
            user=user[:64] if isinstance(user, str) else "",
            # A time between 2001 and 2286: anything else is not one we wrote.
            since=since if isinstance(since, int) and not isinstance(since, bool) and 10**9 <= since < 10**10 else None,
        )


class EngineLock:
    """The host's engine lock: ``acquire`` takes it (or says who has it); the process's exit drops it."""

    def __init__(self, path: Path | None = None):
        self.path = Path(path) if path is not None else engine_lock_path()
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, dashboard_pid: int | None) -> LockHolder | None:
        """Take the lock and write who holds it; None when taken, else the holder the file names.

        OSError when the lock file cannot be opened at all (the caller decides; the engine goes on without it).
        """
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = open_regular_fd(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                return LockHolder.from_text(os.pread(fd, HOLDER_TEXT_LIMIT, 0).decode("utf-8", "replace"))
            finally:
                os.close(fd)
        except BaseException:
            os.close(fd)
            raise
        holder = LockHolder(os.getpid(), dashboard_pid, _user_name(), int(time.time()))
        os.ftruncate(fd, 0)
        os.pwrite(fd, holder.to_text().encode() + b"\n", 0)
        self._fd = fd
        return None

    def release(self) -> None:
        """Drop the lock (an engine that exits drops it anyway)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.ftruncate(fd, 0)
            except OSError:
                pass
            os.close(fd)  # closing the last descriptor releases the flock


def _user_name() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())
