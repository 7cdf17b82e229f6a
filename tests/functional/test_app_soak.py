"""Hundreds of random keys (thousands with TPUDASH_SOAK_KEYS) against a running app; a key typed ahead of a form being built.

The soak's keys are the app's bindings and every screen's bindings (read
from the classes, so a new binding joins the soak by itself), plus focus and
cursor keys, plus random text typed into the Jobs screen's form fields, while
jobs start, run, fail and are cancelled. Keys go out in batches with no wait
between them, so keys typed ahead reach screens and widgets still being
built, as when a user types faster than a loaded machine draws; between
batches the soak waits for the UI's timer tick (never a sleep). Afterwards:
no exception reached the app, no error was shown that a deliberately failing
job or refused input does not explain, the app still answers, and every run
that started has its record on disk with a final status.

How many: every key of the set (37 today) is sent, about 13 times each in
the default 500 random keys (a key the draw missed is sent at the end), with
about 13 immediate repeats (a double enter, a double c) and 30% of the
ordered key pairs per run; every kind of step (random text typed into forms,
the palette with and without a command, a quit declined, jobs done, failed
and cancelled) happens in every run. Each run draws a new seed, so runs add
up to what one long soak sends; TPUDASH_SOAK_KEYS=5000 is one long soak.

Replay a failure with ``TPUDASH_SOAK_SEED=<seed in the failure message>``
(the message also lists the last keys sent). Quit is not in the random
stream (it would end the soak half way): the soak asks to quit while a job
runs and answers no, and quits for real at the end. The command palette is
visited on purpose, never at random: a palette left open would turn the next
random ``enter`` into whatever command matched the random text (Quit,
Screenshot).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import importlib
import logging
import os
import random
import string

import pytest
from textual.app import App
from textual.binding import Binding
from textual.command import CommandList, CommandPalette
from textual.screen import Screen
from textual.widgets import ContentSwitcher, Input
from textual.widgets._select import SelectOverlay

from jobs.events import Metric
from screens.devices import DevicesScreen
from screens.jobs import JobsScreen
from tests.functional.conftest import (
    SIZE,
    UNTIL_TIMEOUT,
    press_to_quit,
    run_settled,
    runtime_ready,
    shown_live,
    type_ahead,
    until,
)
from tpudash.runs.store import RunStore
from tpudash.tui.app import TICK_SECONDS, TpudashApp
from tpudash.tui.dialogs import ConfirmScreen
from tpudash.tui.modes import MODE_SCREENS, RUN_DETAIL_SCREEN
from tpudash.tui.paramform import ParamForm
from tpudash.tui.session import MAX_WAITING_RUNS

# Five hundred keep the default suite under its time budget (see the docstring
# for what they cover); TPUDASH_SOAK_KEYS=5000 soaks longer.
RANDOM_KEYS = int(os.environ.get("TPUDASH_SOAK_KEYS", "500"))
TEXTS_TO_TYPE = 5
MAX_SOAK_STEPS = 1000
BATCH_SIZES = (10, 40)
TICK_TIMEOUT = 30
RECENT_KEYS = 12
QUIT_ACTIONS = {"quit", "app.quit"}
NAVIGATION_KEYS = {
    "tab",
    "shift+tab",
    "enter",
    "escape",
    "up",
    "down",
    "left",
    "right",
    "pageup",
    "pagedown",
    "home",
    "end",
    "space",
    "backspace",
}
# "q" is left out of typed text: typed while no field has focus (a batch may
# land after focus moved) it is the quit key, which this stream never sends.
TYPED_CHARACTERS = "".join(char for char in string.printable if char not in "qQ\t\n\r\x0b\x0c")
# The jobs that would train or build input pipelines keep their real forms
# and checks, but run a stand-in: the soak is about the app, not about TF.
STAND_IN_JOBS = ("train", "dtensor-mlp", "replica-dataset", "all-reduce")
STAND_IN_STEPS = 30
SMALL_MATMUL = {"m": 64, "k": 64, "n": 64, "repeats": 2}
PALETTE_COMMANDS = (
    "Run test-steps",
    "Run test-fails",
    "Run gradient-descent",
    "Cancel the running job",
    "Show History",
    "Show Run view",
    "Form: matmul",
    "Form: train",
)
FINAL_STATUSES = {"done", "failed", "cancelled"}


# -- the key set ------------------------------------------------------------------------


def _binding_keys(bindings) -> list[tuple[str, str]]:
    pairs = []
    for binding in bindings:
        key, action = (binding.key, binding.action) if isinstance(binding, Binding) else (binding[0], binding[1])
        pairs.extend((part.strip(), action) for part in key.split(","))
    return pairs


def tpudash_screens() -> list[type[Screen]]:
    """Every Screen class defined in the app's screen modules (modes, dialogs, pushed screens)."""
    pushed = {RUN_DETAIL_SCREEN[0], "screens.overlay", "tpudash.tui.dialogs"}
    module_names = {module for module, _, _, _ in MODE_SCREENS.values()} | pushed
    classes = []
    for module_name in sorted(module_names):
        module = importlib.import_module(module_name)
        classes.extend(
            value
            for value in vars(module).values()
            if isinstance(value, type) and issubclass(value, Screen) and value.__module__ == module_name
        )
    return classes


def soak_key_set() -> list[str]:
    """Every key the app or one of its screens binds, except quit, plus focus and cursor keys."""
    pairs = _binding_keys(App.BINDINGS) + _binding_keys(TpudashApp.BINDINGS)
    for screen in tpudash_screens():
        pairs += _binding_keys(screen.BINDINGS)
    return sorted({key for key, action in pairs if action not in QUIT_ACTIONS} | NAVIGATION_KEYS)


# -- the jobs ---------------------------------------------------------------------------


def _stand_in(spec):
    def run(ctx, params):
        ctx.log(f"{spec.name}: a stand-in run for the key soak")
        for step in range(STAND_IN_STEPS):
            ctx.raise_if_cancelled()
            ctx.emit(Metric("loss", 1.0 / (step + 1), step, epoch=0))
            ctx.progress(step + 1, STAND_IN_STEPS, "step")
        return {"steps": STAND_IN_STEPS}

    return dataclasses.replace(spec, run=run)


def _small_matmul(spec):
    params = tuple(
        dataclasses.replace(param, default=SMALL_MATMUL[param.name]) if param.name in SMALL_MATMUL else param
        for param in spec.params
    )
    return dataclasses.replace(spec, params=params)


@pytest.fixture
def soak_specs(test_specs) -> dict:
    """Every job the app offers, cheap: a small matmul, stand-ins for the heavy ones, the test jobs."""
    specs = dict(test_specs)
    for name in STAND_IN_JOBS:
        specs[name] = _stand_in(specs[name])
    specs["matmul"] = _small_matmul(specs["matmul"])
    return specs


def is_deliberate_failure(job: str, params: dict, error: str | None) -> bool:
    """A failure the job was asked for: the failing test job, an injected matmul error, a diverging descent."""
    error = error or ""
    if job == "test-fails":
        return error == "ValueError: deliberate failure for the test"
    if job == "matmul":
        return bool(params.get("inject_error"))
    if job == "gradient-descent":
        return error.startswith("Diverged:")
    return False


# -- the soak ---------------------------------------------------------------------------


class KeySoak:
    """Sends keys to a running app and keeps every run the app started.

    Random keys go out in batches without waiting in between, so keys typed
    ahead reach screens that are still being switched to, as when a user
    types faster than a loaded machine draws. The deliberate steps (the quit
    dialog, the palette) first let the app handle every key sent so far, so a
    late key cannot answer the dialog or pick a palette command.
    """

    def __init__(self, app: TpudashApp, pilot, rng: random.Random, key_set: list[str]):
        self.app = app
        self.pilot = pilot
        self.rng = rng
        self.key_set = key_set
        self.random_keys = 0
        self.random_key_counts: collections.Counter = collections.Counter()
        self.keys_sent = 0
        self.texts_typed = 0
        self.quit_dialogs_declined = 0
        self.palette_visits = 0
        self.runs: dict = {}
        """Every LiveRun the session held, by run id (the app forgets old ones)."""
        self.last_keys: collections.deque = collections.deque(maxlen=RECENT_KEYS)
        """The last keys sent, each with the screen and focus it was sent to (for the failure message)."""

    # -- sending ----------------------------------------------------------------------
    def post(self, *keys: str) -> None:
        where = f"{type(self.app.screen).__name__}/{type(self.app.focused).__name__}"
        self.last_keys.append(f"{where}: {' '.join(keys)}")
        type_ahead(self.app, *keys)
        self.keys_sent += len(keys)

    async def press(self, *keys: str, drain: bool = False) -> None:
        self.post(*keys)
        await self.settle(drain=drain)

    async def settle(self, drain: bool = False) -> None:
        """Wait for the UI's next tick (queued after the keys sent); with ``drain``, first until the app is idle."""
        self.assert_alive()
        if drain:
            await self.pilot.pause()
        for _ in range(TICK_TIMEOUT):
            try:
                await asyncio.wait_for(self.app.next_tick(), 1.0)
                break
            except asyncio.TimeoutError:
                self.assert_alive()  # a crashed app ticks no more
        else:
            raise AssertionError(f"the UI timer stopped ticking for {TICK_TIMEOUT} s")
        self.assert_alive()
        for live in list(self.app.session.live_runs.values()):
            self.runs[live.run_id] = live

    async def until(self, predicate) -> None:
        """Wait tick by tick until ``predicate()`` holds."""
        for _ in range(int(UNTIL_TIMEOUT / TICK_SECONDS)):
            if predicate():
                return
            await self.settle()
        stack = " > ".join(type(screen).__name__ for screen in self.app.screen_stack)
        raise AssertionError(
            f"condition not met within {UNTIL_TIMEOUT} s; screens {stack}, focus {type(self.app.focused).__name__}; "
            f"the last keys sent: {' | '.join(self.last_keys)}"
        )

    def assert_alive(self) -> None:
        assert self.app._exception is None, (
            f"an exception reached the app: {self.app._exception!r}; the last keys sent: {' | '.join(self.last_keys)}"
        )
        assert self.app.is_running and self.app.return_code is None, "the app stopped"

    @property
    def typing_into_a_field(self) -> bool:
        """Focus is in a form (a field, a select, a switch, its buttons): letters are typing there, not keys."""
        focused = self.app.focused
        return focused is not None and (
            isinstance(focused, (Input, SelectOverlay))
            or any(isinstance(node, ParamForm) for node in focused.ancestors)
        )

    # -- steps ------------------------------------------------------------------------
    async def random_batch(self, keys: list[str] | None = None) -> None:
        if keys is None:
            keys = [self.rng.choice(self.key_set) for _ in range(self.rng.randint(*BATCH_SIZES))]
        self.random_keys += len(keys)
        self.random_key_counts.update(keys)
        await self.press(*keys)

    async def leave_fields(self) -> None:
        """Let every key sent land, then escape out of a form field (on the Jobs screen escape goes to the job list)."""
        for _ in range(4):
            await self.settle(drain=True)
            if not self.typing_into_a_field:
                return
            self.post("escape")
        raise AssertionError(f"escape does not leave {self.app.focused!r}")

    async def fill_a_form(self) -> None:
        """Open a form (sometimes the next job's), tab to one of its text fields, type random text, maybe enter."""
        await self.press(self.rng.choice(["j", "t"]), *["down"] * self.rng.choice([0, 0, 1, 2]))
        screen = self.app.screen
        if not isinstance(screen, JobsScreen):
            return
        chain = screen.focus_chain
        fields = [widget for widget in chain if isinstance(widget, Input)]
        if not fields or self.app.focused not in chain:
            return
        distance = (chain.index(self.rng.choice(fields)) - chain.index(self.app.focused)) % len(chain)
        await self.press(*["tab"] * distance)
        if not (isinstance(self.app.screen, JobsScreen) and isinstance(self.app.focused, Input)):
            return
        text = "".join(self.rng.choice(TYPED_CHARACTERS) for _ in range(self.rng.randint(1, 8)))
        await self.press(*text)
        self.texts_typed += 1
        if self.rng.random() < 0.5:
            await self.press("enter")

    def held_test_run(self):
        """The running test-steps run (it waits at its gate until cancelled), unless asked to stop."""
        current = self.app.session.current_live_run
        if current is None or current.job != "test-steps" or current.cancel_requested_at is not None:
            return None
        return current

    async def decline_to_quit(self) -> None:
        """Ask to quit while a held run is on the lane, and answer no (n, escape, or enter on "Keep running")."""
        await self.leave_fields()
        held = self.held_test_run()
        if held is None:
            # Launch one and wait for its turn (the queue ahead of it holds a few quick runs at most).
            await self.use_the_palette("Run test-steps")
            launched = self.app.session.live_runs.get(self.app.shown_run_id)
            if launched is None or launched.model.job != "test-steps" or launched.settled.is_set():
                return  # the queue was full
            await self.until(lambda: self.held_test_run() is launched or launched.settled.is_set())
            held = self.held_test_run()
        if held is None or self.app.screen.is_modal or self.typing_into_a_field:
            return
        await self.press("q")
        await self.until(lambda: isinstance(self.app.screen, ConfirmScreen))
        await self.press(self.rng.choice(["n", "escape", "enter"]))
        await self.until(lambda: not isinstance(self.app.screen, ConfirmScreen))
        assert not self.app.session.quitting and held.cancel_requested_at is None, "declining to quit stopped the run"
        assert self.app.session.current_live_run is held, "declining to quit ended the run"
        self.quit_dialogs_declined += 1

    async def use_the_palette(self, command: str | None = None) -> None:
        """Open the palette; run ``command``, or type random text and escape."""
        await self.settle(drain=True)
        if self.app.screen.is_modal:
            return
        await self.press("ctrl+p")
        await self.until(lambda: isinstance(self.app.screen, CommandPalette) and isinstance(self.app.focused, Input))
        palette = self.app.screen
        self.palette_visits += 1
        if command is None:
            await self.press(*(self.rng.choice(TYPED_CHARACTERS) for _ in range(self.rng.randint(1, 12))))
            await self.press("escape")
        else:
            commands = palette.query_one(CommandList)
            await self.press(*command.lower())
            await self.until(
                lambda: (
                    commands.option_count > 0 and str(commands.get_option_at_index(0).prompt).split("\n")[0] == command
                )
            )
            await self.press("enter")
        await self.until(lambda: palette not in self.app.screen_stack)

    async def run(self) -> None:
        # First a failing job, and a quit declined while a held job runs.
        await self.use_the_palette("Run test-fails")
        await self.decline_to_quit()
        for _ in range(MAX_SOAK_STEPS):
            if self.random_keys >= RANDOM_KEYS and self.texts_typed >= TEXTS_TO_TYPE:
                missed = [key for key in self.key_set if key not in self.random_key_counts]
                if missed:  # rare at 500 keys (about 1 run in 20,000): every key is sent once at least
                    self.rng.shuffle(missed)
                    await self.random_batch(missed)
                return
            roll = self.rng.random()
            if roll < 0.30:
                await self.fill_a_form()
            elif roll < 0.34:
                await self.decline_to_quit()
            elif roll < 0.38:
                await self.use_the_palette(self.rng.choice([None, *PALETTE_COMMANDS]))
            else:
                await self.random_batch()
        raise AssertionError(
            f"{MAX_SOAK_STEPS} steps sent {self.random_keys} random keys and typed into {self.texts_typed} fields"
        )


def soak_seed() -> int:
    return int(os.environ.get("TPUDASH_SOAK_SEED") or random.SystemRandom().randrange(2**32))


@pytest.mark.slow
async def test_random_keys_typed_ahead_while_jobs_run_raise_nothing_and_lose_no_run(
    make_app, soak_specs, isolated_runs_dir, caplog
):
    seed = soak_seed()
    try:
        await _soak_then_check(make_app, soak_specs, isolated_runs_dir, caplog, seed)
    except Exception as error:
        raise AssertionError(f"key soak with seed {seed} (replay: TPUDASH_SOAK_SEED={seed}): {error}") from error


async def _soak_then_check(make_app, soak_specs, runs_dir, caplog, seed: int) -> None:
    key_set = soak_key_set()
    assert {"d", "j", "h", "question_mark", "m", "r", "g", "t", "c", "enter", "x"} <= set(key_set)
    assert not {"q", "ctrl+q"} & set(key_set)
    app = make_app(job_specs=soak_specs)
    async with app.run_test(size=SIZE) as pilot:
        await runtime_ready(pilot)
        soak = KeySoak(app, pilot, random.Random(seed), key_set)
        await soak.run()
        soak.assert_alive()

        # The app still answers: back out of any field, show the devices, run
        # gradient descent once the lane is free, then quit for real mid-run.
        await soak.leave_fields()
        await soak.press("d")
        await soak.until(lambda: isinstance(app.screen, DevicesScreen))
        for _ in range(4 * (MAX_WAITING_RUNS + 1)):
            if not app.session.busy:
                break
            await soak.press("c", drain=True)
            await soak.until(
                lambda: app.session.current_live_run is None or app.session.current_live_run.cancel_requested_at is None
            )
        await soak.until(lambda: not app.session.busy)
        await soak.press("g", drain=True)
        descent = shown_live(app)
        assert descent is not None and descent.model.job == "gradient-descent"
        await run_settled(pilot, descent)
        assert descent.model.status == "done"
        soak.runs[descent.run_id] = descent

        await soak.use_the_palette("Run test-steps")
        await soak.until(
            lambda: (
                soak.held_test_run() is not None
                and app.session.live_runs[soak.held_test_run().run_id].model.status == "running"
            )
        )
        last = soak.held_test_run()
        await soak.press("q", drain=True)
        await soak.until(lambda: isinstance(app.screen, ConfirmScreen))
        await press_to_quit(pilot, "y", TICK_TIMEOUT)
        assert app.quit_worker is not None and app.quit_worker.is_finished
    assert app._exception is None and app.return_code == 0

    errors = [message for _, severity, message in app.notices if severity == "error"]
    explained = {
        f"{live.job} failed: {live.model.error}"
        for live in soak.runs.values()
        if live.model.status == "failed" and is_deliberate_failure(live.job, live.params, live.model.error)
    }
    refusals = tuple(f"{name} not launched: " for name in soak_specs)
    unexplained = [message for message in errors if message not in explained and not message.startswith(refusals)]
    assert unexplained == [], "errors shown that no deliberate failure or refused input explains"
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR] == []

    # Every run that started has a record with a final status; the others were
    # cancelled while they waited, and got no directory.
    infos = {info.run_id: info for info in RunStore(runs_dir).list_runs()}
    for run_id, live in soak.runs.items():
        if live.model.started is None:
            assert live.model.status == "cancelled" and run_id not in infos, (
                f"{run_id} never started, yet {live.model.status}"
            )
            continue
        assert run_id in infos, f"{run_id} ({live.job}) started but has no record"
        info = infos[run_id]
        assert info.status in FINAL_STATUSES and info.status == live.model.status, (
            f"{run_id} ({live.job}) recorded as {info.status}, ended {live.model.status}"
        )
        assert not info.problems, f"{run_id}: {info.problems}"
        if info.status == "failed":
            assert is_deliberate_failure(info.job, info.params, info.error), f"{run_id} failed: {info.error}"
    assert set(infos) <= set(soak.runs), "a record on disk the session never knew"
    assert infos[last.run_id].status == "cancelled"

    # The soak did what it claims: jobs were done, cancelled and failed, and a
    # quit was declined while one ran.
    started = [live for live in soak.runs.values() if live.model.started is not None]
    statuses = {live.model.status for live in started}
    assert {"done", "cancelled", "failed"} <= statuses, statuses
    assert soak.quit_dialogs_declined >= 1
    assert set(soak.random_key_counts) == set(key_set), "a key of the set was never sent"
    print(
        f"key soak seed {seed}: {soak.keys_sent} keys ({soak.random_keys} random, {soak.texts_typed} texts), "
        f"{len(soak.runs)} runs ({len(started)} started: "
        f"{ {status: sum(live.model.status == status for live in started) for status in sorted(statuses)} }), "
        f"{soak.quit_dialogs_declined} quit dialogs declined, {soak.palette_visits} palette visits, "
        f"{len(soak.random_key_counts)} of the {len(key_set)} keys sent at random"
    )


async def test_enter_typed_right_after_moving_to_another_job_opens_that_form_and_enter_there_launches(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await runtime_ready(pilot)
        await pilot.press("j")
        screen = app.screen
        first_form = screen.current_form
        # The arrow shows the next job's form, which builds its fields over the
        # next turns of the event loop; enter comes as soon as the form is
        # shown, like a user typing ahead of a busy screen.
        form_shown = asyncio.Event()
        screen.watch(screen.query_one("#forms", ContentSwitcher), "current", lambda _: form_shown.set(), init=False)
        type_ahead(app, "down")
        await asyncio.wait_for(form_shown.wait(), UNTIL_TIMEOUT)
        next_form = screen.current_form
        assert next_form is not first_form
        type_ahead(app, "enter")
        await pilot.pause()
        assert app._exception is None, f"enter on the half-built {next_form.spec.name} form: {app._exception!r}"
        assert [message for _, severity, message in app.notices if severity == "error"] == []
        await until(pilot, lambda: app.focused is next_form.fields[0].input)
        assert not app.session.live_runs
        # Its first field is a dropdown, where enter opens the list; tab reaches Launch.
        type_ahead(app, "tab")
        await until(pilot, lambda: app.focused is next_form.query_one("Button.launch"))
        type_ahead(app, "enter")
        await until(pilot, lambda: shown_live(app) is not None)
        await run_settled(pilot, shown_live(app))
        assert shown_live(app).model.job == next_form.spec.name
