"""Keeps native writes to file descriptor 2 off the user's terminal.

TensorFlow's C++ runtime logs (absl, oneDNN, CUDA probing) and tfds's tqdm
bars write straight to fd 2, around Python's ``sys.stderr``. In the TUI that
tears the screen; headless it buries the output. ``NativeStderr`` points fd 2
at a session log file and hands Python a private duplicate of the original
terminal, so tpudash's own messages (and Textual, which draws on
``sys.__stderr__``) still reach the user.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path


def session_log_path(runs_dir: Path | str | None) -> Path:
    """``<runs_dir>/.logs/session-<UTC time>-<pid>.log``, or the temp dir (a runs directory in a store too).

    A session's native log is this host's: it is never written into a bucket.
    """
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    local = [Path(runs_dir) / ".logs"] if isinstance(runs_dir, Path) else []
    for base in local + [Path(tempfile.gettempdir()) / "tpudash-logs"]:
        try:
            base.mkdir(parents=True, exist_ok=True)
            return base / f"session-{stamp}-{os.getpid()}.log"
        except OSError:
            continue
    return Path(os.devnull)


_active: NativeStderr | None = None


def active_position() -> int:
    """How much the session log holds now (0 when fd 2 is not redirected)."""
    try:
        return _active.log_path.stat().st_size if _active is not None else 0
    except OSError:
        return 0


def active_tail(lines: int = 20, since: int = 0) -> list[str]:
    """The last lines written to the session log after offset ``since``, while fd 2 points at it."""
    return _active.tail(lines, since) if _active is not None else []


class NativeStderr:
    """Context manager: fd 2 → ``log_path``; Python's stderr → the real terminal."""

    def __init__(self, log_path: Path):
        self.log_path = Path(log_path)
        self._saved_fd: int | None = None
        self._saved_streams: tuple | None = None

    def start(self) -> NativeStderr:
        if self._saved_fd is not None:
            return self
        try:
            sys.stderr.flush()
            self._saved_fd = os.dup(2)
            log_fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError:
            self._saved_fd = None
            return self
        os.dup2(log_fd, 2)
        os.close(log_fd)
        terminal = os.fdopen(
            os.dup(self._saved_fd), "w", buffering=1, encoding=sys.stderr.encoding or "utf-8", errors="backslashreplace"
        )
        self._saved_streams = (sys.stderr, sys.__stderr__)
        sys.stderr = terminal
        # typeshed calls it final; faulthandler and Textual's driver write to
        # sys.__stderr__, and they must reach the terminal too.
        setattr(sys, "__stderr__", terminal)  # noqa: B010 - a plain assignment is refused by the type checker
        global _active
        _active = self
        return self

    def stop(self) -> None:
        global _active
        if self._saved_fd is None or self._saved_streams is None:
            return
        if _active is self:
            _active = None
        terminal = sys.stderr
        try:
            terminal.flush()
        except (OSError, ValueError):
            pass
        sys.stderr = self._saved_streams[0]
        setattr(sys, "__stderr__", self._saved_streams[1])  # noqa: B010 - see start()
        os.dup2(self._saved_fd, 2)
        os.close(self._saved_fd)
        self._saved_fd = None
        try:
            terminal.close()
        except (OSError, ValueError):
            pass

    def __enter__(self) -> NativeStderr:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def tail(self, lines: int = 20, since: int = 0) -> list[str]:
        """The last lines TensorFlow wrote (after byte offset ``since``), for an error report."""
        return read_tail(self.log_path, lines, since)


def read_tail(path: Path, lines: int = 20, since: int = 0) -> list[str]:
    """The last ``lines`` lines of a log file after byte offset ``since`` ([] if unreadable)."""
    try:
        with open(path, "rb") as log:
            log.seek(since)
            text = log.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    return text.splitlines()[-lines:]
