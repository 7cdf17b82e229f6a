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
import re
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

# An absl/glog line: "I0000 00:00:1795828360.286231   18973 port.cc:153] message" (before absl's log is
# set up its clock reads 00:00:<seconds>), "W1128 01:02:03.456789   18973 file.cc:42] message", or the
# older "2024-01-02 03:04:05.678901: W tensorflow/…/cuda_dart.cc:42] message": the level, then the message.
_GLOG_LINE = re.compile(
    r"^(?:([IWEF])\d{4} [\d:.]+\s+\d+\s+|\d{4}-\d\d-\d\d [\d:.]+: ([IWEF]) )"
    r"[^\s\]]+:\d+\]\s?(.*)$"
)
# What TensorFlow, absl and XLA write on every start on a machine without a GPU (and a few of their
# routine warnings): never why an engine crashed. The session log keeps them.
STARTUP_NOISE = (
    "oneDNN custom operations are on",
    "Could not find cuda drivers on your machine",
    "failed call to cuInit",
    "Cannot dlopen some GPU libraries",
    "Could not load dynamic library",
    "Ignore above cudart dlerror",
    "Unable to register cuDNN factory",
    "Unable to register cuFFT factory",
    "Unable to register cuBLAS factory",
    "Attempting to register factory for plugin",
    "computation placer already registered",
    "TF-TRT Warning: Could not find TensorRT",
    "This TensorFlow binary is optimized to use available CPU instructions",
    "rebuild TensorFlow with the appropriate compiler flags",
    "NUMA node",
    "NUMA support",
    "Local rendezvous is aborting with status: OUT_OF_RANGE: End of sequence",
    "disabling MLIR crash reproducer",
    "Compiled cluster using XLA",
    "TF_FORCE_GPU_ALLOW_GROWTH",
)
# Whole lines of noise without absl's prefix: absl's own first words, the second line of TensorFlow's CPU
# instructions notice, and the end of Python's fault handler report (every extension module loaded).
_UNPREFIXED_NOISE = re.compile(
    r"^(?:WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|To enable the following instructions: .*rebuild TensorFlow with the appropriate compiler flags\.?"
    r"|Extension modules: .*)$"
)


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


def is_startup_noise(line: str) -> bool:
    """``line`` is what TensorFlow, absl or XLA print on every start, or an informational log line.

    An absl/glog line at level I is information, never an error; one at W or
    E counts as noise only when its message is one of ``STARTUP_NOISE``; F
    (fatal) never does. A line without absl's prefix is noise only when it is
    absl's "before InitializeLog" warning, the second line of TensorFlow's
    CPU instructions notice, or the list of extension modules Python's fault
    handler ends with.
    """
    text = line.strip()
    logged = _GLOG_LINE.match(text)
    if logged is None:
        return _UNPREFIXED_NOISE.match(text) is not None
    level = logged.group(1) or logged.group(2)
    if level == "I":
        return True
    return level != "F" and any(message in logged.group(3) for message in STARTUP_NOISE)


def crash_reason_lines(lines: Iterable[str], keep: int) -> tuple[list[str], int]:
    """The last ``keep`` lines of a crashed process's stderr that say something, and how many were noise.

    Blank lines and start-up noise (``is_startup_noise``) are left out, so
    the reason shown is the process's real last error lines.
    """
    meaningful, noise = [], 0
    for line in lines:
        if not line.strip():
            continue
        if is_startup_noise(line):
            noise += 1
        else:
            meaningful.append(line)
    return meaningful[-keep:] if keep > 0 else [], noise
