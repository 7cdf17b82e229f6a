"""JSON lines between tpudash and a child process it started: framing, answers matched by id, parent death.

tpudash's children speak JSON lines over their stdin and stdout: the engine
(``python -m tpudash.engine``), the TPU probe (``tpudash.accel.tpuprobe``)
and the TensorCore probe (``tpudash.telemetry.tensorcore``). A child's stdout
is also where a library inside it may print, and a request may time out
while the child is still working on it. So:

- a protocol line is one JSON object; any other line is skipped and the last
  few are kept (``noise``) to say what the child printed, never raised;
- a request carries an ``id`` and its answer echoes it: an answer that
  arrives after its request timed out is dropped, never taken for the answer
  to the next request;
- a child claims its real stdout for the protocol (``claim_stdout``) and
  sends everything else written to file descriptor 1 to its stderr.

``parent_death_signal`` is the one way a child is tied to its parent's life
(Linux): a child left behind by a killed tpudash could hold the TPU for good.
"""

from __future__ import annotations

import functools
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import IO, Any

ID_FIELD = "id"
NOISE_LINES_KEPT = 20
NOISE_LINE_CHARS = 500
# After its stdout closes, how long a child gets to be reaped before its exit status is given up on.
EXIT_WAIT_SECONDS = 2.0
PR_SET_PDEATHSIG = 1  # from <sys/prctl.h>

Payload = dict[str, Any]


def encode_line(payload: Mapping[str, Any]) -> str:
    """One protocol line: ``payload`` as a JSON object, newline-terminated (values JSON lacks become text)."""
    return json.dumps(payload, default=str) + "\n"


def decode_line(line: str) -> Payload | None:
    """The JSON object on ``line``; None for anything else (a library's print, a torn line)."""
    try:
        payload = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return payload if isinstance(payload, dict) else None


class LineReader:
    """A child's stdout read on a thread: each protocol line to ``deliver``, every other line kept in ``noise``.

    A line ``deliver`` cannot use (it raises ValueError, as a message with a
    wrong field does) is kept in ``noise`` with the reason. ``on_end`` runs
    once the stream ends: the child closed its stdout or exited.
    """

    def __init__(
        self,
        stream: IO[str],
        deliver: Callable[[Payload], None],
        *,
        name: str,
        on_end: Callable[[], None] | None = None,
        noise_kept: int = NOISE_LINES_KEPT,
    ):
        self._stream = stream
        self._deliver = deliver
        self._on_end = on_end
        self.noise: deque[str] = deque(maxlen=noise_kept)
        """The child's last lines that were not protocol lines (for diagnostics)."""
        self.noise_count = 0
        """How many lines were not protocol lines, all told (``noise`` keeps the last few)."""
        self._thread = threading.Thread(target=self._read, name=name, daemon=True)

    def start(self) -> LineReader:
        self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _read(self) -> None:
        try:
            for line in self._stream:
                payload = decode_line(line)
                if payload is None:
                    if line.strip():
                        self.noise.append(line.rstrip("\n")[:NOISE_LINE_CHARS])
                        self.noise_count += 1
                    continue
                try:
                    self._deliver(payload)
                except ValueError as error:
                    self.noise.append(f"{error}: {line.strip()[:NOISE_LINE_CHARS]}")
                    self.noise_count += 1
        except (OSError, ValueError):
            pass  # the stream was closed under the reader: the child is being ended
        finally:
            if self._on_end is not None:
                self._on_end()


class ChildGone(Exception):
    """The child ended (or closed its pipes) before it answered; ``returncode`` says how, when known."""

    def __init__(self, returncode: int | None):
        super().__init__(f"the child ended (exit status {returncode})")
        self.returncode = returncode


class AnswerTimeout(TimeoutError):
    """The child did not answer within the time given; it may still be working on it."""


class RequestChannel:
    """Requests on a child's stdin, answers from its stdout, matched by id.

    ``request`` waits at most its timeout. An answer to an earlier request
    that timed out is dropped when it arrives, so every answer ``request``
    returns is the one to its own request.
    """

    def __init__(self, command: list[str], *, name: str, **popen_options: Any):
        self._process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            errors="replace",
            bufsize=1,
            **popen_options,
        )
        self._answers: queue.Queue[Payload | None] = queue.Queue()
        assert self._process.stdout is not None
        self._reader = LineReader(
            self._process.stdout, self._answers.put, name=name, on_end=lambda: self._answers.put(None)
        ).start()
        self._last_id = 0
        self._ended = False

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def noise(self) -> list[str]:
        """What the child printed on its stdout that was not a protocol line (the last few lines)."""
        return list(self._reader.noise)

    @property
    def noise_count(self) -> int:
        """How many lines on the child's stdout were not protocol lines, all told."""
        return self._reader.noise_count

    def request(self, payload: Mapping[str, Any], timeout: float) -> Payload:
        """Send ``payload`` with a new id and return the answer that echoes it.

        Raises AnswerTimeout after ``timeout`` seconds without it, and
        ChildGone when the child ends first.
        """
        self._last_id += 1
        request_id = self._last_id
        if self._ended:
            raise ChildGone(self._returncode())
        try:
            assert self._process.stdin is not None
            self._process.stdin.write(encode_line({**payload, ID_FIELD: request_id}))
            self._process.stdin.flush()
        except (OSError, ValueError):
            self._ended = True
            raise ChildGone(self._returncode()) from None
        deadline = time.monotonic() + timeout
        while True:
            try:
                answer = self._answers.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AnswerTimeout(f"no answer within {timeout:g} s") from None
            if answer is None:
                self._ended = True
                raise ChildGone(self._returncode())
            if answer.get(ID_FIELD) == request_id:
                return answer
            # Otherwise the answer to a request that already timed out: nobody's now.

    def _returncode(self) -> int | None:
        try:
            return self._process.wait(EXIT_WAIT_SECONDS)
        except subprocess.TimeoutExpired:
            return None

    def finish(self, timeout: float) -> int | None:
        """Close the child's stdin (its loop ends) and wait up to ``timeout`` for it to exit; killed after that."""
        try:
            if self._process.stdin is not None:
                self._process.stdin.close()
        except OSError:
            pass
        try:
            return self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            return self.kill()

    def kill(self) -> int:
        """End the child now (if it has not ended), reap it, and return its exit status."""
        try:
            self._process.kill()
        except OSError:
            pass
        returncode = self._process.wait()
        self._reader.join(EXIT_WAIT_SECONDS)
        for stream in (self._process.stdin, self._process.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        return returncode


# -- the child's side ---------------------------------------------------------------------


def claim_stdout() -> IO[str]:
    """The real stdout, for protocol lines only; whatever else writes to file descriptor 1 goes to stderr.

    A library's print or progress bar would otherwise land in the middle of
    the protocol (a bar without a newline tears the next answer's line).
    """
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    sys.stdout.flush()
    os.dup2(2, 1)
    sys.stdout = os.fdopen(1, "w", encoding="utf-8", errors="replace", buffering=1, closefd=False)
    return replies


def serve_requests(answer: Callable[[Payload], Mapping[str, Any]], requests: IO[str], replies: IO[str]) -> None:
    """The child's loop until its stdin closes: each request answered by one line that echoes its id.

    Lines that are not protocol lines are skipped.
    """
    for line in requests:
        request = decode_line(line)
        if request is None:
            continue
        reply = dict(answer(request))
        reply[ID_FIELD] = request.get(ID_FIELD)
        replies.write(encode_line(reply))
        replies.flush()


@functools.cache
def parent_death_signal(signum: int, expected_parent: int | None = None) -> Callable[[], None] | None:
    """Linux: a function that has the kernel send ``signum`` to the process calling it when its parent dies.

    Pass it as ``preexec_fn`` when starting a child, or call it first thing
    in a child; with ``expected_parent`` the child also exits at once if
    that parent already died before the call. None where there is no prctl:
    the parent's own timeouts still apply.
    """
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def set_parent_death_signal() -> None:
        prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
        if expected_parent is not None and os.getppid() != expected_parent:
            os._exit(1)  # the parent died before prctl took effect

    return set_parent_death_signal
