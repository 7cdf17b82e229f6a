"""A training loop recorded with ``tpudash.record`` on a thread, profiled on request as the dashboard asks.

The loop calls ``step_body(run, n)`` inside ``run.step(n)`` until told to stop;
the test's thread writes a request with ``request_profile`` and waits for the
writer's answer file (bounded), then stops the loop. Shared by the JAX profile
tests and their oracles.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tpudash
from tpudash.profiles.requests import ProfileAnswer, ProfileRequest, request_profile, wait_for_answer
from tpudash.recording import RecordedRun
from tpudash.runs.backends import RunFiles
from tpudash.runs.store import RunStore

StepBody = Callable[[RecordedRun, int], None]


@dataclass
class ProfiledLoop:
    """What came of it: the run, its files, the request and the writer's answer (None: none in time)."""

    run: RecordedRun
    files: RunFiles
    request: ProfileRequest
    answer: ProfileAnswer | None


def profile_recorded_loop(
    runs_dir: Path, name: str, step_body: StepBody, *, steps: int, timeout: float = 120.0
) -> ProfiledLoop:
    """Run the loop, ask for a profile of ``steps`` steps, wait for the answer, stop the loop; raise what it raised."""
    stop = threading.Event()
    begun = threading.Event()
    raised: list[BaseException] = []
    runs: list[RecordedRun] = []

    def loop() -> None:
        try:
            with tpudash.record(name, runs_dir=runs_dir) as run:
                runs.append(run)
                begun.set()
                step = 0
                while not stop.is_set() and step < 100_000:
                    step += 1
                    with run.step(step):
                        step_body(run, step)
        except BaseException as error:  # noqa: BLE001 - raised again on the test's thread
            raised.append(error)
        finally:
            begun.set()

    training = threading.Thread(target=loop, name=f"training {name}")
    training.start()
    try:
        assert begun.wait(timeout) and not raised, raised
        files = RunStore(runs_dir).files(runs[0].run_id)
        request = request_profile(files, steps=steps)
        answer = wait_for_answer(files, request.id, timeout=timeout, poll=0.05)
    finally:
        stop.set()
        training.join(timeout)
    assert not training.is_alive(), f"the loop did not stop within {timeout} s"
    if raised:
        raise raised[0]
    return ProfiledLoop(runs[0], files, request, answer)
