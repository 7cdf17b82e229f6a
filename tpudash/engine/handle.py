"""The dashboard's handle on its engine: send commands, kill it, hear its replies and how it ended.

``EngineProcess`` starts ``python -m tpudash.engine`` as a child in a session
of its own, with its stderr (TensorFlow's C++ logs) going to the session log.
It reads the engine's replies on a reader thread and passes each, as a
``tpudash.engine.protocol`` message, to the listener, then once an
``EngineExit``. ``tpudash.engine.inthread.EngineThread`` is the same handle on
the engine's loop run in this process (tests). This module imports neither
TensorFlow nor the engine's server, so the dashboard's import graph stays
free of the runner and the jobs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tpudash.childproc import ID_FIELD, LineReader, Payload, encode_line
from tpudash.engine.protocol import REPLIES, Command, Release, Reply, decode, encode

STDERR_TAIL_LINES = 12
# How far back a crashed engine's stderr is read for its last lines that are not start-up noise.
STDERR_READ_LINES = 200


@dataclass(frozen=True)
class EngineExit:
    """How an engine ended: its return code, the signal that killed it, its last stderr lines."""

    returncode: int | None
    signal_name: str | None
    stderr_tail: list[str]
    requested: bool
    """True when the dashboard released or killed it (not a crash)."""
    stderr_noise: int = 0
    """How many of its last stderr lines were TensorFlow's start-up noise, left out of ``stderr_tail``
    (the session log keeps them)."""

    @classmethod
    def from_stderr(
        cls, returncode: int | None, signal_name: str | None, stderr_lines: list[str], requested: bool
    ) -> EngineExit:
        """An exit whose ``stderr_tail`` is the last lines of ``stderr_lines`` that say something.

        TensorFlow, absl and XLA print the same lines on every start
        (``tpudash.accel.nativelog.is_startup_noise``); a crash's reason is
        what came after them.
        """
        from tpudash.accel.nativelog import crash_reason_lines

        tail, noise = crash_reason_lines(stderr_lines, STDERR_TAIL_LINES)
        return cls(returncode, signal_name, tail, requested, noise)

    def describe(self) -> str:
        if self.signal_name:
            return f"the engine was killed by {self.signal_name}"
        return f"the engine exited with status {self.returncode}"

    def stderr_words(self) -> str:
        """What a crash's message says of the engine's stderr ("" when it wrote nothing)."""
        if self.stderr_tail:
            return "; its last stderr lines: " + " | ".join(self.stderr_tail)
        if self.stderr_noise:
            return "; its stderr held only TensorFlow's start-up messages (the session log keeps them)"
        return ""


EngineNews = Reply | EngineExit
Listener = Callable[[EngineNews], None]


class EngineHandle:
    """What the dashboard's lane needs of an engine: send, kill, and the messages it reports.

    ``listener`` is called on a reader thread with every reply, then once
    with the ``EngineExit``. Replies the dashboard cannot read are kept in
    ``noise`` with the reason.
    """

    pid: int | None = None

    def __init__(self, listener: Listener):
        self._listener = listener
        self._write_lock = threading.Lock()
        self._commands: IO[str] | None = None
        self._last_id = 0
        self._reader: LineReader | None = None
        self.release_requested = False
        self.kill_reason: str | None = None

    def send(self, command: Command) -> bool:
        """Write one command (with an id of its own); False when the engine is gone."""
        with self._write_lock:
            return self._write(command)

    def _write(self, command: Command) -> bool:
        if self._commands is None:
            return False
        self._last_id += 1
        try:
            self._commands.write(encode_line({**encode(command), ID_FIELD: self._last_id}))
            self._commands.flush()
            return True
        except (OSError, ValueError):
            return False

    def release(self) -> None:
        """Ask the engine to exit (it cancels its job, records it, and leaves)."""
        self.release_requested = True
        with self._write_lock:
            if self._commands is not None:
                self._write(Release())
                try:
                    self._commands.close()
                except (OSError, ValueError):
                    pass
                self._commands = None

    def kill(self, reason: str) -> None:
        raise NotImplementedError

    @property
    def alive(self) -> bool:
        raise NotImplementedError

    @property
    def noise(self) -> list[str]:
        """Lines from the engine that were no reply it could read (the last few, for diagnostics)."""
        return list(self._reader.noise) if self._reader is not None else []

    def _read_replies(self, replies: IO[str], on_end: Callable[[], None], name: str) -> None:
        self._reader = LineReader(replies, self._deliver, name=name, on_end=on_end).start()

    def _deliver(self, payload: Payload) -> None:
        self._listener(decode(payload, REPLIES))  # a ProtocolError keeps the line as noise


ENGINE_MODULE = "tpudash.engine"


class EngineProcess(EngineHandle):
    """``python -m tpudash.engine`` as a child: new session, stderr to ``log_path``.

    ``module``: the module run as the engine (the test suite's ``tests.engine_main`` adds jobs that never ship).
    """

    def __init__(
        self,
        listener: Listener,
        settings: Any,
        log_path: Path,
        environ: Mapping[str, str] | None = None,
        *,
        module: str = ENGINE_MODULE,
    ):
        super().__init__(listener)
        from tpudash.config import settings_environment

        self.log_path = Path(log_path)
        environment = settings_environment(settings, dict(os.environ if environ is None else environ))
        try:
            self._log_offset = self.log_path.stat().st_size
        except OSError:
            self._log_offset = 0
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                [sys.executable, "-m", module],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=environment,
                text=True,
                encoding="utf-8",
                errors="replace",
                bufsize=1,
                start_new_session=True,
                close_fds=True,
            )
        self.pid = self._process.pid
        self._commands = self._process.stdin
        assert self._process.stdout is not None
        self._read_replies(self._process.stdout, self._report_exit, "tpudash-engine-reader")

    @property
    def alive(self) -> bool:
        return self._process.poll() is None

    def kill(self, reason: str) -> None:
        self.kill_reason = reason
        try:
            self._process.kill()
        except OSError:
            pass

    def _report_exit(self) -> None:
        returncode = self._process.wait()
        from tpudash.accel.nativelog import read_tail

        signal_name = None
        if returncode is not None and returncode < 0:
            try:
                signal_name = signal.Signals(-returncode).name
            except ValueError:
                signal_name = f"signal {-returncode}"
        requested = self.release_requested or self.kill_reason is not None
        stderr_lines = read_tail(self.log_path, STDERR_READ_LINES, self._log_offset)
        self._listener(EngineExit.from_stderr(returncode, signal_name, stderr_lines, requested))
