"""The run view's Profile tab (issue 39, item 3) and ``p`` (item 1), through Textual's pilot, without TensorFlow.

The summaries are real ``summary.json`` files XProf's converter wrote for two
Keras fits on CPU (``profile_summaries/``: one waiting 40 ms per batch on its
input, one busy in wide Dense layers). The run's writer and the converter are
fakes handed to the tab (``ProfileCalls``), answering when the test says, so
every state is seen; ``p`` in the real dashboard writes a real request into a
real run directory, and says why on a run that ended.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from textual.app import App, ComposeResult
from textual.widgets import Static, TabbedContent

from jobs.events import RunFinished
from tpudash.profiles.requests import ProfileAnswer, ProfileRequest, read_requests
from tpudash.profiles.summary import CaptureInfo, ProfileError, ProfileSummary
from tpudash.runs.layout import new_run_id
from tpudash.runs.model import RunModel
from tpudash.runs.store import RunStore
from tpudash.tui.profile_requests import ProfileCalls
from tpudash.tui.profiletab import PROFILE_PANE, ProfileTab
from tpudash.tui.runview import RunView

FIXTURES = Path(__file__).parent / "profile_summaries"
INPUT_BOUND = ProfileSummary.from_json(json.loads((FIXTURES / "input_bound.json").read_text()))
COMPUTE_BOUND = ProfileSummary.from_json(json.loads((FIXTURES / "compute_bound.json").read_text()))
SIZE = (120, 60)


class ProfileApp(App):
    """One run view; ``p`` profiles its run as the run screens do (the run's status is the test's)."""

    BINDINGS = [("p", "profile", "Profile")]

    def __init__(self, status: str = "running") -> None:
        super().__init__()
        self.status = status
        self.said: list[str] = []

    def compose(self) -> ComposeResult:
        yield RunView(RunModel(run_id="r", job="fit", status=self.status), id="view")

    def action_profile(self) -> None:
        why = self.query_one(RunView).profile_run(self.status)
        if why:
            self.said.append(why)


class FakeWriter:
    """The run's writer and XProf, played by the test: answers and summaries come when it says."""

    def __init__(self, run_files, captures: list[ProfileSummary]) -> None:
        self.files = run_files
        self.summaries = {summary.capture: summary for summary in captures}
        self.listed = [CaptureInfo(summary.capture, ["vm"], True, None) for summary in captures]
        self.answers: list[ProfileAnswer | None] = []
        self.answered = threading.Event()
        self.convert_error: str | None = None
        self.requests: list[int] = []

    def calls(self) -> ProfileCalls:
        return ProfileCalls(
            request=self.request,
            answer=self.answer,
            captures=lambda files: list(self.listed),
            summary=lambda files, name: None,
            summarize=self.summarize,
            poll_seconds=0.01,
        )

    def request(self, files, steps: int) -> ProfileRequest:
        self.requests.append(steps)
        return ProfileRequest("20261128T080000-abcdef", steps, None, 0.0, "test:1")

    def answer(self, files, request_id: str) -> ProfileAnswer | None:
        return self.answers[-1] if self.answers else None

    def say(self, state: str, *, reason: str | None = None, capture: str | None = None) -> None:
        self.answers.append(
            ProfileAnswer("20261128T080000-abcdef", state, reason, capture, 6, 10, "vm", 0, "tensorflow", 1.0, None)
        )

    def summarize(self, files, capture: str) -> ProfileSummary:
        if self.convert_error:
            raise ProfileError(self.convert_error)
        return self.summaries[capture]


class FakeFiles:
    where = "/runs/20261128-080000-fit-abcdef"
    local_dir = Path("/runs/20261128-080000-fit-abcdef")


async def settle(pilot, predicate, tries: int = 400) -> None:
    """Let the tab's thread workers land, a frame at a time, until ``predicate()`` holds."""
    for _ in range(tries):
        if predicate():
            return
        await pilot.pause(0.01)
    raise AssertionError("the tab never reached the state the test waits for")


def state_line(app: App) -> str:
    return str(app.query_one("#profile-state", Static).content)


def body(app: App) -> str:
    return str(app.query_one("#profile-body", Static).content)


async def follow(pilot, writer: FakeWriter, *, live: bool = True) -> ProfileTab:
    view = pilot.app.query_one(RunView)
    tab = view.profile_tab()
    tab.calls = writer.calls()
    view.follow_profiles(writer.files, live=live)
    await pilot.pause()
    if live:  # the tab on show, as a user looking at it sees it (an ended run's tab is listed only with a capture)
        pilot.app.query_one("#run-tabs", TabbedContent).active = PROFILE_PANE
        await pilot.pause()
    return tab


async def test_the_tab_reads_each_section_of_a_summary():
    app = ProfileApp()
    async with app.run_test(size=SIZE) as pilot:
        writer = FakeWriter(FakeFiles(), [INPUT_BOUND])
        await follow(pilot, writer)
        await settle(pilot, lambda: "Step time" in body(app))
        text = body(app)
        assert "avg 41.2 ms · min 40.7 ms · max 41.7 ms · σ 0.36 ms" in text
        assert text.count("█") > 20  # the per-step bars, the stacked bar, the ops' bars
        for step in ("step 4", "step 8"):
            assert step in text
        assert "■ input / infeed 95.0 %" in text and "■ host compute 4.4 %" in text and "■ idle 0.0 %" in text
        assert "Input pipeline: input-bound (input 95.0 % of the step)" in text
        assert "Your program is HIGHLY input-bound" in text
        assert "slowest tf.data stages" in text and "ForeverRepeat[0]::ParallelMapV2 " in text
        assert text.count("not measured on CPU") == 4 and "0.0 %" not in text.split("Utilisation")[1].split("Top")[0]
        assert "EagerPyFunc" in text and "Iterator::Root::Prefetch" in text
        assert "• Look at Section 3 for the breakdown of input time on the host." in text
        assert "The full trace: xprof --logdir /runs/20261128-080000-fit-abcdef/profile" in text
        tabs = app.query_one("#run-tabs", TabbedContent)
        assert tabs.get_tab(PROFILE_PANE).display, "a live run's Profile tab is listed"


async def test_p_follows_the_answer_through_each_state_then_shows_the_summary():
    app = ProfileApp()
    async with app.run_test(size=SIZE) as pilot:
        writer = FakeWriter(FakeFiles(), [COMPUTE_BOUND])
        writer.listed = []
        await follow(pilot, writer)
        await settle(pilot, lambda: "Press p to profile the next 5 steps" in state_line(app))
        assert "It has no capture yet." in state_line(app)
        await pilot.press("p")
        await settle(pilot, lambda: "waiting for the run's writer" in state_line(app))
        assert writer.requests == [5]
        assert app.query_one("#run-tabs", TabbedContent).active == PROFILE_PANE
        writer.say("capturing")
        await settle(pilot, lambda: "vm: capturing steps 6–10" in state_line(app))
        await pilot.press("p")
        assert app.said == ["a profile of this run is already on its way"] and writer.requests == [5]
        writer.listed = [CaptureInfo(COMPUTE_BOUND.capture, ["vm"], True, None)]
        writer.say("done", capture=COMPUTE_BOUND.capture)
        await settle(pilot, lambda: "Profile of steps 6–10." in state_line(app))
        assert "Input pipeline: not input-bound" in body(app)
        assert "_MklNativeFusedMatMul" in body(app)


async def test_a_writer_that_cannot_profile_and_a_converter_without_xprof_are_their_sentences():
    app = ProfileApp()
    async with app.run_test(size=SIZE) as pilot:
        writer = FakeWriter(FakeFiles(), [INPUT_BOUND])
        writer.listed = []
        await follow(pilot, writer)
        writer.say("failed", reason="a profiler is already running in this process (e.g. a TensorBoard callback's)")
        await pilot.press("p")
        await settle(pilot, lambda: "could not profile" in state_line(app))
        assert state_line(app) == (
            "The run's writer could not profile: a profiler is already running in this process "
            "(e.g. a TensorBoard callback's)"
        )
        writer.answers = []
        writer.convert_error = 'reading a profile needs xprof: pip install "tpudash[profile]"'
        await pilot.press("p")
        await settle(pilot, lambda: "waiting" in state_line(app))
        writer.say("done", capture=INPUT_BOUND.capture)
        await settle(pilot, lambda: "could not be read" in state_line(app))
        assert 'reading a profile needs xprof: pip install "tpudash[profile]"' in state_line(app)
        assert body(app) == ""


async def test_p_on_a_run_that_ended_says_why_and_asks_nothing():
    app = ProfileApp(status="done")
    async with app.run_test(size=SIZE) as pilot:
        writer = FakeWriter(FakeFiles(), [])
        await follow(pilot, writer, live=False)
        tabs = app.query_one("#run-tabs", TabbedContent)
        assert not tabs.get_tab(PROFILE_PANE).display, "an ended run without a capture lists no Profile tab"
        await pilot.press("p")
        assert app.said == ["this run is not live (done): nothing is training to profile"]
        assert writer.requests == []
        assert tabs.active == PROFILE_PANE and "This run is not live (done)" in state_line(app)


async def test_every_capture_is_listed_newest_first_and_two_go_side_by_side():
    app = ProfileApp(status="done")
    async with app.run_test(size=SIZE) as pilot:
        writer = FakeWriter(FakeFiles(), [COMPUTE_BOUND, INPUT_BOUND])
        tab = await follow(pilot, writer, live=False)
        await settle(pilot, lambda: "Step time" in body(app))
        listing = app.query_one("#profile-captures")
        assert [option.id for option in listing.options] == [COMPUTE_BOUND.capture, INPUT_BOUND.capture]
        assert tab.shown == COMPUTE_BOUND.capture, "the newest capture is shown"
        assert app.query_one("#run-tabs", TabbedContent).get_tab(PROFILE_PANE).display
        listing.focus()
        listing.highlighted = 1
        await pilot.press("b")
        await settle(pilot, lambda: "Side by side" in body(app))
        text = body(app)
        assert f"{INPUT_BOUND.capture}" in text.split("\n")[1] and f"{COMPUTE_BOUND.capture}" in text.split("\n")[1]
        assert "step time avg" in text and "41.2 ms" in text and "42.7 ms" in text and "+1.51 ms (+4 %)" in text
        assert "input / infeed" in text and "+-" not in text and "-94.66 %" in text
        await pilot.press("b")  # again: taken away
        await settle(pilot, lambda: "Side by side" not in body(app))


async def test_p_in_the_dashboard_writes_a_request_into_a_live_run_and_not_into_an_ended_one(tmp_path):
    from screens.run_detail import RunDetailScreen
    from tests.functional.test_snapshots import DESCRIPTION
    from tpudash.accel.description import Runtime
    from tpudash.config import Settings
    from tpudash.engine.inthread import EngineThread
    from tpudash.tui.app import TpudashApp
    from tpudash.tui.palette import TpudashCommands

    runs_dir = tmp_path / "runs"
    store = RunStore(runs_dir)
    live_id, ended_id = new_run_id("fit"), new_run_id("fit")
    live_recorder = store.create(live_id, "fit", {}, {"kind": "CPU"})
    ended = store.create(ended_id, "fit", {}, {"kind": "CPU"})
    ended.record(RunFinished(status="done", summary={}))
    ended.close()
    settings = Settings(cpu_devices=8, runs_dir=runs_dir, data_dir=tmp_path / "tfds", telemetry_interval=0)
    runtime = Runtime(strategy=None, description=DESCRIPTION)
    app = TpudashApp(settings, engine_factory=lambda listener: EngineThread(listener, settings, {}, lambda: runtime))
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            for run_id, live in ((ended_id, False), (live_id, True)):
                screen = RunDetailScreen(run_id)
                await app.push_screen(screen)
                await settle(pilot, lambda screen=screen: screen.loaded)
                await pilot.press("p")
                await settle(
                    pilot, lambda live=live, run_id=run_id: not live or bool(read_requests(store.files(run_id)))
                )
                tab = screen.view.profile_tab()
                if live:
                    assert [request.steps for request in read_requests(store.files(run_id))] == [5]
                    assert tab.state in ("requested", "capturing")
                else:
                    assert not (runs_dir / run_id / "profile").exists(), "nothing is written into an ended run"
                    assert "This run is not live (done)" in tab.state_line
                    assert any("not live (done)" in str(notice.message) for notice in app._notifications)
                app.pop_screen()
                await pilot.pause()
            # The palette's "Profile this run" is p of the run on screen; elsewhere it says where to go first.
            command = next(entry for entry in TpudashCommands(app.screen)._commands() if entry[0] == "Profile this run")
            command[1]()
            await pilot.pause()
            assert any("Open a run first" in str(notice.message) for notice in app._notifications)
            screen = RunDetailScreen(live_id)
            await app.push_screen(screen)
            await settle(pilot, lambda: screen.loaded)
            screen.view.profile_tab().busy = False  # the first request's wait is not this one's
            command[1]()
            await settle(pilot, lambda: len(read_requests(store.files(live_id))) == 2)
    finally:
        live_recorder.close()
