"""The engine's runs answer profile requests: a responder per run, given to the job as ``JobContext.profiler``.

A job that ``profiles_steps`` (train) gets a ``tpudash.profiles.capture.ProfileResponder``:
it profiles the steps asked for by ``tpudash profile`` or the dashboard, and the window of
``tpudash run --profile-steps A-B`` (``schedule``), into ``<run>/profile``. Any other job
(matmul, the checks: timed kernels, no training steps) gets none; its run's requests are
answered at once by ``StepsRefuser``, failed, "this job has no training steps to profile",
so that whoever asked hears it in a second rather than waiting out their timeout.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tpudash.runs.backends import RunFiles

log = logging.getLogger(__name__)

NO_STEPS_REASON = "this job has no training steps to profile"
RUN_ENDED_REASON = "the run ended before the profile started"
# As the responder's: requests are looked for at most once a second, never per step.
POLL_SECONDS = 1.0


def start_profiler(
    files: RunFiles,
    *,
    profiles_steps: bool,
    worker: int,
    local_root: Path | None,
    started_at: float,
    say: Callable[[str, str], None] | None = None,
    framework: str = "tensorflow",
) -> Any:
    """The run's responder, started (``profiles_steps``), or a refuser of its requests; None if neither starts.

    ``framework``: what the run's job runs on (the runtime's), whose profiler captures its steps.

    ``say(level, text)``: the run's log, where the responder says what it captured or why not
    (from its own thread). A failure here never stops the run: profiling is an extra, logged and left out.
    """
    try:
        if not profiles_steps:
            return StepsRefuser(files, worker=worker, started_at=started_at, framework=framework).start()
        from tpudash.profiles.capture import ProfileResponder

        return ProfileResponder(
            files, framework=framework, worker=worker, local_root=local_root, started_at=started_at, log=say
        ).start()
    except Exception:  # noqa: BLE001 - a run is never lost because its profiler could not start
        log.exception("the run's profile responder did not start; its profile requests go unanswered")
        return None


def close_profiler(profiler: Any, reason: str = RUN_ENDED_REASON) -> None:
    """End the responder (it answers what is still pending with ``reason``); never raises."""
    if profiler is None:
        return
    try:
        profiler.close(reason)
    except Exception:  # noqa: BLE001 - the run has ended already; its record must still be finished
        log.exception("the run's profile responder did not close cleanly")


def captured(profiler: Any) -> list[str]:
    """Where each capture the run's responder made is (a directory, or a URL in a store), in order."""
    from tpudash.profiles.requests import CAPTURES_FOLDER, STATE_DONE

    where = []
    for answer in getattr(profiler, "answers", ()):
        if answer.state != STATE_DONE or answer.capture is None:
            continue
        local = profiler.files.local_dir
        where.append(
            str(local / CAPTURES_FOLDER / answer.capture)
            if local is not None
            else f"{profiler.files.where.rstrip('/')}/{CAPTURES_FOLDER}/{answer.capture}"
        )
    return where


class StepsRefuser:
    """Answers every profile request of a run whose job has no training steps: failed, and why.

    Polls ``profile/requests`` once a second on its own daemon thread; a request for
    another worker, one already answered, or one older than the run is left alone.
    """

    def __init__(
        self,
        files: RunFiles,
        *,
        worker: int = 0,
        started_at: float | None = None,
        reason: str = NO_STEPS_REASON,
        poll_seconds: float = POLL_SECONDS,
        framework: str = "tensorflow",
    ):
        self.files = files
        self.framework = framework
        self.worker = worker
        self.started_at = time.time() if started_at is None else started_at
        self.reason = reason
        self.poll_seconds = poll_seconds
        self.answered: set[str] = set()
        self.answers: list[Any] = []  # none done: a refuser never captures
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="tpudash-profile-refuser", daemon=True)

    def start(self) -> StepsRefuser:
        self._thread.start()
        return self

    def answer_pending(self) -> int:
        """Answer the requests not answered yet; how many were."""
        from tpudash.profiles.requests import ProfileAnswer, read_answer, read_requests, write_answer

        count = 0
        for request in read_requests(self.files):
            if request.id in self.answered or (request.worker or 0) != self.worker:
                continue
            if request.requested_at < self.started_at - 1.0 or read_answer(self.files, request.id) is not None:
                self.answered.add(request.id)
                continue
            write_answer(
                self.files,
                ProfileAnswer(
                    id=request.id,
                    state="failed",
                    reason=self.reason,
                    capture=None,
                    first_step=None,
                    last_step=None,
                    host=socket.gethostname(),
                    worker=self.worker,
                    framework=self.framework,
                    answered_at=time.time(),
                    capture_seconds=None,
                ),
            )
            self.answered.add(request.id)
            count += 1
        return count

    def _poll(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            try:
                self.answer_pending()
            except Exception:  # noqa: BLE001 - a store away for a while: asked again next second
                log.debug("profile requests could not be read or answered", exc_info=True)

    # A job without steps calls none of these; they are here so the refuser is a profiler to any caller.
    def step_begin(self, step: int) -> None:
        pass

    def step_end(self, step: int) -> None:
        pass

    def schedule(self, first: int, last: int) -> None:
        pass

    def close(self, reason: str = RUN_ENDED_REASON) -> None:
        self._stop.set()
        try:
            self.answer_pending()  # what came in during the last second still hears why
        except Exception:  # noqa: BLE001
            log.debug("profile requests could not be answered at the run's end", exc_info=True)
