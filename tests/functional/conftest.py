"""Fixtures for driving the Textual app with Pilot.

The app under test shares the session's 8-device CPU runtime (its engine is
an ``EngineThread`` on it, through ``engine_factory``), keeps fd 2 alone (pytest captures it) and records runs
in the test's own runs directory. Waiting is always on something the app
signals — the runtime answering, a run settling, the UI's next timer tick —
never on a sleep.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import unicodedata

import pytest
from textual import events
from textual.keys import REPLACED_KEYS, _character_to_key, _get_unicode_name_from_key

from jobs import registry
from jobs.base import JobSpec, Param
from jobs.events import Metric, Table
from tpudash.engine.inthread import thread_engine_factory
from tpudash.tui.app import TpudashApp

SIZE = (120, 40)
RUN_TIMEOUT = 120.0
UNTIL_TIMEOUT = 60.0


class JobGate:
    """Lets a test hold a job mid-run (to look at the live view) and release it."""

    def __init__(self):
        self.reached = threading.Event()
        self.release = threading.Event()

    def wait(self, ctx) -> None:
        self.reached.set()
        # Bounded, so a test that fails before releasing never leaves the job
        # (and pytest's exit) waiting for ever.
        for _ in range(int(RUN_TIMEOUT / 0.05)):
            if self.release.wait(0.05) or ctx.cancelled():
                return


def _steps_job(gate: JobGate | None = None) -> JobSpec:
    """Emits a falling loss per step (named like train's), then a val loss; a gate holds it half way."""

    def run(ctx, params):
        steps = params["steps"]
        for step in range(steps):
            ctx.raise_if_cancelled()
            if gate is not None and step == steps // 2:
                gate.wait(ctx)
                ctx.raise_if_cancelled()
            ctx.emit(Metric("batch_loss", 1.0 / (step + 1), step, epoch=0))
            ctx.progress(step + 1, steps, "step")
        ctx.emit(Metric("loss", 1.0 / steps, steps, epoch=0, split="val"))
        ctx.emit(Table("steps", ["steps", "final loss"], [[steps, 1.0 / steps]]))
        return {"final_loss": 1.0 / steps}

    return JobSpec(
        name="test-steps",
        title="Test steps",
        description="A test job that emits one loss per step.",
        params=(Param("steps", "int", 20, "how many steps", minimum=2, maximum=10_000),),
        run=run,
    )


def _failing_job() -> JobSpec:
    def run(ctx, params):
        ctx.log("about to fail")
        raise ValueError("deliberate failure for the test")

    return JobSpec(name="test-fails", title="Test fails", description="A test job that raises.", params=(), run=run)


@pytest.fixture
def job_gate() -> JobGate:
    gate = JobGate()
    yield gate
    gate.release.set()


@pytest.fixture
def test_specs(job_gate) -> dict:
    """The real registry plus two test jobs (one held by ``job_gate``, one that raises)."""
    specs = dict(registry())
    specs["test-steps"] = _steps_job(job_gate)
    specs["test-fails"] = _failing_job()
    return specs


@pytest.fixture
def make_app(settings, runtime, test_specs):
    """``make_app(runtime_provider=None, **options)`` → a TpudashApp whose engine runs on a thread, fd 2 untouched.

    The engine (``EngineThread``) uses ``runtime_provider``, the shared runtime by default.
    """

    def make(runtime_provider=None, **options) -> TpudashApp:
        specs = options.setdefault("job_specs", test_specs)
        options.setdefault(
            "engine_factory", thread_engine_factory(settings, specs, runtime_provider or (lambda: runtime))
        )
        return TpudashApp(settings, **options)

    return make


async def runtime_ready(pilot) -> None:
    """Wait until the runtime worker has answered and the screens have heard of it."""
    await asyncio.wait_for(pilot.app.runtime_settled.wait(), RUN_TIMEOUT)
    await pilot.pause()


async def run_settled(pilot, live, timeout: float = RUN_TIMEOUT) -> None:
    """Wait until the run's worker has ended and the UI has shown its end."""
    assert live is not None, "the launch was refused"
    await asyncio.wait_for(live.settled.wait(), timeout)
    await pilot.pause()


async def until(pilot, predicate, timeout: float = UNTIL_TIMEOUT) -> None:
    """Wait, tick by tick of the app's UI timer, until ``predicate()`` holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        remaining = deadline - loop.time()
        try:
            if remaining <= 0:
                raise TimeoutError
            await asyncio.wait_for(pilot.app.next_tick(), remaining)
        except TimeoutError:
            # Name the condition: a CI log cut in the middle must still say which wait ran out.
            raise AssertionError(f"condition not met within {timeout} s: {_source_of(predicate)}") from None
    await pilot.pause()


def _source_of(predicate) -> str:
    try:
        return inspect.getsource(predicate).strip()
    except (OSError, TypeError):
        return repr(predicate)


async def type_into(pilot, widget, text: str) -> None:
    """Focus an Input, clear it, and type ``text`` key by key as a user would."""
    widget.focus()
    widget.value = ""
    await pilot.press(*text)


def shown_live(app):
    """The session run the Run view shows."""
    return app.session.live_runs.get(app.shown_run_id)


def key_event(key: str) -> events.Key:
    """The Key event ``Pilot.press`` would send for ``key``."""
    if len(key) == 1 and not key.isalnum():
        key = _character_to_key(key)
    try:
        character = unicodedata.lookup(_get_unicode_name_from_key(REPLACED_KEYS.get(key, key)))
    except KeyError:
        character = key if len(key) == 1 else None
    return events.Key(key, character)


def type_ahead(app, *keys: str) -> None:
    """Queue key events for the app without waiting for any of them to be handled: keys typed ahead."""
    for key in keys:
        event = key_event(key)
        event.set_sender(app)
        app.post_message(event)


async def press_to_quit(pilot, key: str, timeout: float = UNTIL_TIMEOUT) -> None:
    """Press a key that ends the app (q with nothing to ask about, y to the quit question); wait until it stopped.

    Not ``pilot.press``: that waits for Textual's animations to complete, and a tab's underline that starts
    moving as the app closes (Tabs moves it on the screen's last idle, after the animator has stopped) never
    completes, so the press would wait forever.
    """
    app = pilot.app
    type_ahead(app, key)
    await until(pilot, lambda: not app.is_running, timeout)
