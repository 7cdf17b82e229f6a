"""The writer's side of a profile: ``ProfileResponder`` answers requests by profiling the run's next steps.

One responder per writer (``TpudashCallback``, ``tpudash.record``, the
engine's runner). Its own daemon thread lists ``profile/requests/`` at most
once every ``poll_seconds`` (one listing while nothing is new); the step hooks
the training loop calls (``step_begin``, ``step_end``) only read attributes,
so a run nobody profiles pays no file-system call per step. When a request for
this worker is there, the next ``step_begin`` starts the framework's profiler
(TensorFlow's ``tf.profiler.experimental``, JAX's ``jax.profiler``), and the
``step_end`` N steps later stops it. The capture is where XProf and TensorBoard
look for it, ``<run>/profile/plugins/profile/<capture>/<host>.xplane.pb``: the
profiler writes it there for a run on this host's disk; for a run in a bucket
it writes into a local directory and each file is then uploaded through
``RunFiles.write``. The answer (``tpudash.profiles.requests``) says capturing,
then done with the steps captured, or failed with the reason.

``marker(step)`` is the framework's step marker (XProf's overview is empty
without one), always on: about a microsecond while no profiler runs.

Nothing here may make training fail: a profiler that cannot start or stop
is a failed answer and a line in the run's log. The framework is imported
the first time a marker or a profile needs it, never at import time.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpudash.profiles.frameworks import FrameworkProfiler, framework_profiler
from tpudash.profiles.requests import (
    ANSWERS_FOLDER,
    CAPTURES_FOLDER,
    FRAMEWORKS,
    PROFILE_FOLDER,
    REQUESTS_FOLDER,
    STATE_CAPTURING,
    STATE_DONE,
    STATE_FAILED,
    ProfileAnswer,
    ProfileRequest,
    load_request,
    new_request_id,
    write_answer,
)
from tpudash.runs.backends import RunFiles
from tpudash.runs.heartbeat import CLOCK_SKEW_SECONDS

REASON_RUN_ENDED = "the run ended before the profile started"
REASON_PROFILER_BUSY = "a profiler is already running in this process (e.g. a TensorBoard callback's)"
FRAMEWORK_TITLES = {"tensorflow": "TensorFlow", "jax": "JAX"}
# How long ``close`` waits for the poller's last work (an answer, a capture's upload) before the run ends anyway.
CLOSE_WAIT_SECONDS = 5.0
# How far past a second's end a capture may still be named by that second (a coarse clock's tick, ≤ 10 ms).
CLOCK_TICK_MARGIN_SECONDS = 0.1
Log = Callable[[str, str], None]
"""Where the responder says what it did: ``log(level, text)``, the run's log."""


def ended_during(first: int, last: int) -> str:
    """The reason of a profile the run's end cut short, with the steps it holds."""
    return f"the run ended during the profile (steps {first}–{last} captured)"


def cannot_profile(framework: str, error: BaseException) -> str:
    """The reason of a profile the framework refused."""
    detail = str(error).strip() or "no message"
    return f"{FRAMEWORK_TITLES.get(framework, framework)} cannot profile here: {type(error).__name__}: {detail}"[:1000]


@dataclass
class _Window:
    """Steps to profile: asked for (the next ``steps``), or scheduled (``first``…``last``)."""

    id: str
    steps: int
    first: int | None = None
    last: int | None = None
    before: frozenset[tuple[str, int, int]] = frozenset()
    """The files under the captures folder before this profile: the new ones are its capture."""


@dataclass
class _Capture:
    window: _Window
    first: int
    stop_at: int
    started: float
    last_ended: int | None = None


class ProfileResponder:
    """Answers a run's profile requests by profiling its next steps; see the module docstring.

    ``files``: the run. ``framework``: ``tensorflow`` or ``jax``. ``worker``: this
    writer's index in a cluster (a request for ``worker: null`` is the chief's,
    0). ``local_root``: for a run in a bucket, the local directory laid out as
    the run (its local directory, uploaded at the finish; default a temporary
    one), the capture written to ``<local_root>/profile`` and uploaded from
    there. ``profiler``: the framework's profiler (default
    ``framework_profiler(framework)``). ``log``: where it says what it did.
    ``started_at``: requests older than this (less the clock skew allowed) are
    ignored; default now.
    """

    def __init__(
        self,
        files: RunFiles,
        *,
        framework: str,
        worker: int = 0,
        local_root: Path | None = None,
        host: str | None = None,
        poll_seconds: float = 1.0,
        profiler: FrameworkProfiler | None = None,
        log: Log | None = None,
        started_at: float | None = None,
    ) -> None:
        if framework not in FRAMEWORKS:
            raise ValueError(f"framework: {framework!r} cannot be profiled; allowed: {', '.join(FRAMEWORKS)}")
        self.files = files
        self.framework = framework
        self.worker = worker
        self.host = host or socket.gethostname()
        self.poll_seconds = poll_seconds
        self.profiler = profiler if profiler is not None else framework_profiler(framework)
        self.started_at = time.time() if started_at is None else started_at
        self._log = log
        self._local_root = files.local_dir or local_root
        self.answers: list[ProfileAnswer] = []
        """What this responder answered, in order (the last one of each request is on the bus)."""
        # Read by the step hooks without a lock: set by the poller (or ``schedule``) only while both are None.
        self._armed: _Window | None = None
        self._capture: _Capture | None = None
        self._arming = threading.Lock()
        self._polling = threading.Lock()
        self._answering = threading.Lock()
        self._queued: deque[_Window] = deque()
        self._next_capture_at = 0.0
        self._poll_failing = False
        # Work the training thread hands the poller (answers to write, a capture to place): no I/O in a step.
        self._outbox: deque[Callable[[], None]] = deque()
        self._seen: set[str] = set()
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def armed(self) -> str | None:
        """The id of the profile that starts at the next step (a request's, or a scheduled window's); None if none."""
        window = self._armed
        return window.id if window is not None else None

    # -- the poller --------------------------------------------------------------------------
    def start(self) -> ProfileResponder:
        """Start polling for requests on a daemon thread (once)."""
        if self._thread is None and not self._closed.is_set():
            self._thread = threading.Thread(target=self._poll_forever, name="tpudash-profile", daemon=True)
            self._thread.start()
        return self

    def _poll_forever(self) -> None:
        next_poll = 0.0
        while not self._closed.is_set():
            self._wake.clear()  # before the work: a wake-up during it is kept for the wait below
            self._run_outbox()
            self._guarded(self._arm_next, "arming the next profile")
            if time.monotonic() >= next_poll:
                self._poll_quietly()
                next_poll = time.monotonic() + self.poll_seconds
            self._wake.wait(max(0.0, next_poll - time.monotonic()))

    def _poll_quietly(self) -> None:
        """A look for requests; a store that cannot be read is said once (not every second) until it can again."""
        try:
            self._poll()
        except Exception as error:  # noqa: BLE001 - a profile's trouble is never the training's
            if not self._poll_failing:
                self._say("warning", f"profile requests cannot be read ({type(error).__name__}: {error}); retrying")
            self._poll_failing = True
            return
        if self._poll_failing:
            self._say("info", "profile requests can be read again")
        self._poll_failing = False

    def _poll(self) -> None:
        """One look at ``profile/requests/`` (a listing); new requests for this worker queue, the first is armed."""
        with self._polling:  # the poller's and ``poll_now``'s: each request is queued once
            self._queued.extend(_Window(id=request.id, steps=request.steps) for request in self._unanswered())
            self._arm_next()

    def _unanswered(self) -> list[ProfileRequest]:
        """This worker's new requests without an answer, oldest first; each request file is read once."""
        names = self.files.list(REQUESTS_FOLDER)
        new = sorted(name[: -len(".json")] for name in names if name.endswith(".json"))
        new = [request_id for request_id in new if request_id not in self._seen]
        if not new:
            return []
        answered = {name[: -len(".json")] for name in self.files.list(ANSWERS_FOLDER)}
        pending = []
        for request_id in new:
            self._seen.add(request_id)
            if request_id in answered:
                continue
            try:
                request = load_request(self.files, request_id)
            except FileNotFoundError:
                continue
            except (OSError, ValueError) as error:
                self._say("warning", f"profile request {request_id[:80]} skipped: {error}")
                continue
            if self._is_mine(request):
                pending.append(request)
        return sorted(pending, key=lambda request: (request.requested_at, request.id))  # ids tell seconds apart only

    def _is_mine(self, request: ProfileRequest) -> bool:
        """Whether this writer answers ``request``: its worker's (null: the chief's), asked since the run began."""
        wanted = 0 if request.worker is None else request.worker
        return wanted == self.worker and request.requested_at >= self.started_at - CLOCK_SKEW_SECONDS

    def _arm_next(self) -> None:
        """The first queued profile armed for the next step, when none is armed or under way (one at a time)."""
        if not self._queued or self._armed is not None or self._capture is not None:
            return
        if time.time() < self._next_capture_at:
            return  # the profiler names a capture by its second: one more in the same second would overwrite it
        before = self._capture_files()  # the files already there: the new ones will be this profile's capture
        with self._arming:
            if self._queued and self._armed is None and self._capture is None and not self._closed.is_set():
                window = self._queued.popleft()
                window.before = before
                self._armed = window

    def schedule(self, first: int, last: int) -> None:
        """Profile steps ``first`` to ``last`` (a window known in advance: ``tpudash run --profile-steps A-B``)."""
        if isinstance(first, bool) or isinstance(last, bool) or not 0 <= first <= last:
            raise ValueError(f"steps {first!r}–{last!r}: allowed: 0 ≤ first ≤ last")
        self._queued.append(_Window(id=new_request_id(), steps=last - first + 1, first=first, last=last))
        self._arm_next()

    # -- the step hooks (training thread; attributes only while nothing is asked) ------------
    def step_begin(self, step: int) -> None:
        """Before step ``step``: start the profiler if a profile is asked for from this step."""
        window = self._armed
        if window is None or self._capture is not None:
            return
        if window.first is not None and step < window.first:
            return
        self._begin_capture(window, step)

    def step_end(self, step: int) -> None:
        """After step ``step``: stop the profiler once the steps asked for are done."""
        capture = self._capture
        if capture is None or step < capture.first:
            return
        capture.last_ended = step
        if step >= capture.stop_at:
            self._end_capture(capture, step, None)

    def marker(self, step: int) -> AbstractContextManager[Any]:
        """The framework's step marker around step ``step`` (what XProf's step-time figures read)."""
        try:
            return self.profiler.marker(step)
        except Exception:  # noqa: BLE001 - a marker must never stop a step
            return contextlib.nullcontext()

    def input_marker(self) -> AbstractContextManager[Any]:
        """The framework's mark for time spent waiting for input (``frameworks.INPUT_MARKER_NAME``): XProf's input share."""
        try:
            return self.profiler.input_marker()
        except Exception:  # noqa: BLE001 - a marker must never stop a step
            return contextlib.nullcontext()

    def _begin_capture(self, window: _Window, step: int) -> None:
        if window.last is not None and step > window.last:
            self._armed = None
            self._answer_later(window, STATE_FAILED, f"steps {window.first}–{window.last} had passed", step, None)
            return
        stop_at = window.last if window.last is not None else step + window.steps - 1
        capture = _Capture(window, first=step, stop_at=stop_at, started=time.perf_counter())
        self._capture = capture  # set before the window is let go: the poller arms nothing in between
        self._armed = None
        try:
            self.profiler.start(str(self._logdir()))
        except Exception as error:  # noqa: BLE001 - never the training's failure
            self._capture = None
            reason = REASON_PROFILER_BUSY if self.profiler.is_busy(error) else cannot_profile(self.framework, error)
            self._answer_later(window, STATE_FAILED, reason, None, None)
            return
        self._answer_later(window, STATE_CAPTURING, None, step, None)

    def _end_capture(self, capture: _Capture, last: int, reason: str | None) -> None:
        self._capture = None
        try:
            self.profiler.stop()
        except Exception as error:  # noqa: BLE001
            self._answer_later(capture.window, STATE_FAILED, cannot_profile(self.framework, error), capture.first, last)
            return
        seconds = time.perf_counter() - capture.started
        # The next second, and a little: a profiler may name folders by a coarser clock (``time(NULL)``, a tick behind).
        self._next_capture_at = math.floor(time.time()) + 1.0 + CLOCK_TICK_MARGIN_SECONDS
        self._later(lambda: self._place(capture, last, seconds, reason))  # the poller arms what is queued next

    # -- placing a capture, answering (the poller's thread) ---------------------------------
    def _logdir(self) -> Path:
        """Where the profiler writes: ``<run>/profile``, or its local copy for a run in a bucket."""
        if self._local_root is None:
            self._local_root = Path(tempfile.mkdtemp(prefix="tpudash-profile-"))
        return self._local_root / PROFILE_FOLDER

    def _captures_dir(self) -> Path:
        return self._logdir() / "plugins" / "profile"

    def _capture_files(self) -> frozenset[tuple[str, int, int]]:
        """Every file under the local captures folder: (``<capture>/<name>``, modified ns, size)."""
        found: set[tuple[str, int, int]] = set()
        root = self._captures_dir()
        for folder, _, names in os.walk(root):
            relative = Path(folder).relative_to(root).as_posix()
            for name in names if relative != "." else ():
                with contextlib.suppress(OSError):  # gone since the listing
                    status = os.lstat(os.path.join(folder, name))
                    found.add((f"{relative}/{name}", status.st_mtime_ns, status.st_size))
        return frozenset(found)

    def _place(self, capture: _Capture, last: int, seconds: float, reason: str | None) -> None:
        """Find what the profiler wrote; upload it for a run in a bucket; answer done (or why not)."""
        window = capture.window
        # New or rewritten: two workers on one host may write the same capture folder within a second.
        new = sorted({name for name, _, _ in self._capture_files() - window.before})
        folders = sorted({name.split("/", 1)[0] for name in new if name.endswith(".xplane.pb")})
        if not folders:
            self._answer(window, STATE_FAILED, "the profiler wrote no capture", capture.first, last, seconds)
            return
        name = folders[-1]
        if self.files.local_dir is None:
            try:
                self._upload(name, [file for file in new if file.startswith(f"{name}/")])
            except Exception as error:  # noqa: BLE001 - the capture stays local; the run's finish uploads it
                self._answer(
                    window,
                    STATE_FAILED,
                    f"the capture could not be uploaded to {self.files.where} ({type(error).__name__}: {error}); "
                    f"it is in {self._captures_dir() / name}",
                    capture.first,
                    last,
                    seconds,
                )
                return
        self._answer(window, STATE_DONE, reason, capture.first, last, seconds, capture=name)

    def _upload(self, name: str, relative_files: list[str]) -> None:
        root = self._captures_dir()
        for relative in relative_files:
            path = root / relative
            self.files.write(f"{CAPTURES_FOLDER}/{relative}", path.read_bytes())
            path.unlink(missing_ok=True)  # in the store now: what stays locally is what the finish must upload
        with contextlib.suppress(OSError):
            (root / name).rmdir()

    def _answer_later(
        self, window: _Window, state: str, reason: str | None, first: int | None, last: int | None
    ) -> None:
        self._later(lambda: self._answer(window, state, reason, first, last, None))

    def _later(self, work: Callable[[], None]) -> None:
        self._outbox.append(work)
        if self._thread is None or self._closed.is_set():
            return  # no poller to hand it to: ``close`` (or the next ``start``) does it
        self._wake.set()

    def _run_outbox(self, wait: float = -1) -> None:
        # One thread at a time, in order: a "capturing" never lands after its "done". ``close`` waits a bounded time.
        if not self._answering.acquire(timeout=wait):
            return
        try:
            while self._outbox:
                self._guarded(self._outbox.popleft(), "answering a profile request")
        finally:
            self._answering.release()

    def _answer(
        self,
        window: _Window,
        state: str,
        reason: str | None,
        first: int | None,
        last: int | None,
        seconds: float | None,
        capture: str | None = None,
    ) -> None:
        answer = ProfileAnswer(
            id=window.id,
            state=state,
            reason=reason,
            capture=capture,
            first_step=first,
            last_step=last,
            host=self.host[:256],
            worker=self.worker,
            framework=self.framework,
            answered_at=time.time(),
            capture_seconds=None if seconds is None else round(seconds, 6),
        )
        self.answers.append(answer)
        write_answer(self.files, answer)
        if state == STATE_DONE:
            where = f"{self.files.where}/{CAPTURES_FOLDER}/{capture}"
            self._say("info", f"profile of steps {first}–{last} captured in {seconds or 0:.2f} s: {where}")
        elif state == STATE_FAILED:
            self._say("warning", f"profile {window.id} failed: {reason}")

    # -- the end ----------------------------------------------------------------------------
    def close(self, reason: str = REASON_RUN_ENDED) -> None:
        """The run ends: a profile under way is stopped and answered; what is pending is answered ``reason``.

        Waits at most ``CLOSE_WAIT_SECONDS`` for the poller; never raises.
        """
        if self._closed.is_set():
            return
        with self._arming:
            self._closed.set()  # under the lock: the poller arms nothing once this is set
        self._wake.set()
        capture = self._capture
        if capture is not None:
            self._capture = None
            if capture.last_ended is None:  # no step of it was done: nothing to show
                self._guarded(self.profiler.stop, "stopping the profiler")
                self._answer_later(capture.window, STATE_FAILED, reason, None, None)
            else:
                last = capture.last_ended
                self._guarded(lambda: self._end_capture(capture, last, ended_during(capture.first, last)), "stopping")
        if self._thread is not None:
            self._thread.join(CLOSE_WAIT_SECONDS)
        pending = [self._armed] if self._armed is not None else []
        self._armed = None
        pending += list(self._queued)
        self._queued.clear()
        for window in pending:
            self._answer_later(window, STATE_FAILED, reason, None, None)
        self._run_outbox(wait=CLOSE_WAIT_SECONDS)
        if self._thread is not None and not self._thread.is_alive() and not self._poll_failing:
            # One last look, unless the store is away (the run's finish must not wait for it twice).
            self._guarded(lambda: self._answer_unanswered(reason), "answering the run's last profile requests")

    def poll_now(self) -> None:
        """One look for requests and the answers due, on the caller's thread (a writer without the poller, tests)."""
        self._run_outbox()
        self._guarded(self._poll, "reading the run's profile requests")

    def _answer_unanswered(self, reason: str) -> None:
        if not self._polling.acquire(timeout=CLOSE_WAIT_SECONDS):
            return  # the poller is stuck in a look at the store: its requests stay unanswered
        try:
            unanswered = self._unanswered()
        finally:
            self._polling.release()
        for request in unanswered:
            self._answer(_Window(id=request.id, steps=request.steps), STATE_FAILED, reason, None, None, None)

    def _guarded(self, work: Callable[[], None], doing: str) -> None:
        try:
            work()
        except Exception as error:  # noqa: BLE001 - a profile's trouble is never the training's
            self._say("warning", f"profiling: {doing} failed ({type(error).__name__}: {error})")

    def _say(self, level: str, text: str) -> None:
        if self._log is None:
            return
        with contextlib.suppress(Exception):  # the run may have finished: nothing more to say there
            self._log(level, text)
