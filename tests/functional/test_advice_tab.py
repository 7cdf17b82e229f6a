"""The run view's Advice tab, its header lines and the recompile marks on its plots (issue 40), through Textual's pilot.

A run's advice.json is written here with ``write_report`` into a real run
directory (and one in a ``memory://`` bucket), as the run's writer does; the
view reads it on its own thread workers, driven by the display beat the run
screens give it (``Beat``). No TensorFlow.
"""

from __future__ import annotations

import time
import uuid

import pytest
from textual.app import App, ComposeResult
from textual.widgets import Static, TabbedContent

from jobs.events import Metric, RunFinished
from tpudash.advice.mfu import Mfu
from tpudash.advice.report import ADVICE_FILE, AdviceReport, CompileMark, write_report
from tpudash.advice.rules import Advice
from tpudash.runs.layout import new_run_id
from tpudash.runs.model import RunModel
from tpudash.runs.store import RunStore
from tpudash.tui import advicetab
from tpudash.tui.advicetab import ADVICE_PANE, AdviceFeed
from tpudash.tui.advicetext import FIX_STYLE, STATE_MARKS
from tpudash.tui.plots import RECOMPILE_LABEL, MetricPlot, plots_drawn
from tpudash.tui.runview import RunView

SIZE = (100, 40)
PADDING = Advice(
    "padding",
    "fires",
    "would waste 92 % of the matrix unit on a TPU (sizes 10, 100, 1000 not multiples of 128)",
    "use layer widths that are multiples of 128 and a per-core batch that is a multiple of 8",
)
PREFETCH = Advice(
    "prefetch", "fires", "no prefetch at the end of the pipeline", "dataset = dataset.prefetch(tf.data.AUTOTUNE)"
)
CACHE = Advice("cache", "quiet", "the data is cached")
MFU = Mfu(0.229, "measured: matmul check 20261128-100000-matmul-a1b2c3 (CPU)", "XLA cost analysis", 1e9, 10.0, 4.4e10)
MARKS = (
    CompileMark(0, 1.0, "one_step_on_data", 1, ""),
    CompileMark(30, 2.0, "one_step_on_data", 2, "input signature (64, 28, 28) after (100, 28, 28)"),
)


def report(run_id: str, found: list[Advice], **kwargs) -> AdviceReport:
    kwargs.setdefault("framework", "tensorflow")
    kwargs.setdefault("updated", 1_795_000_000.0)
    return AdviceReport.of(run_id, found, **kwargs)


class AdviceApp(App):
    """One run view, synced on a beat as the run screens sync it on the app's display tick."""

    def __init__(self, model: RunModel) -> None:
        super().__init__()
        self.model = model

    def compose(self) -> ComposeResult:
        yield RunView(self.model, id="view")

    def on_mount(self) -> None:
        self.set_interval(0.02, self.beat)

    def beat(self) -> None:
        # As the app's ticks stop once it is exiting (tpudash.tui.ticks): not while its widgets go away.
        # Textual's shutdown stops running before it removes a widget, and a beat may land during it,
        # with the header there and its lines gone.
        if not self.is_running:
            return
        for view in self.query(RunView):
            view.sync()


def live_run(tmp_path, *, job: str = "fit"):
    store = RunStore(tmp_path / "runs")
    run_id = new_run_id(job)
    recorder = store.create(run_id, job, {}, {"kind": "CPU"})
    return store, run_id, recorder


async def settle(pilot, predicate, tries: int = 1000) -> None:
    """Let the view's thread workers land, a frame at a time, until ``predicate()`` holds."""
    for _ in range(tries):
        if predicate():
            return
        await pilot.pause(0.01)
    raise AssertionError("the view never reached the state the test waits for")


def body(app: App) -> str:
    return str(app.query_one("#advice-body", Static).content)


def header_line(app: App, name: str) -> str | None:
    line = app.query_one(f"#run-{name}", Static)
    return str(line.content) if line.display else None


def tab_listed(app: App) -> bool:
    return bool(app.query_one("#run-tabs", TabbedContent).get_tab(ADVICE_PANE).display)


@pytest.fixture
def fast_reads(monkeypatch):
    monkeypatch.setattr(advicetab, "LOCAL_READ_SECONDS", 0.05)
    monkeypatch.setattr(advicetab, "STORE_READ_SECONDS", 0.05)


async def test_every_rule_is_listed_firing_first_then_not_checked_then_quiet(tmp_path, fast_reads):
    store, run_id, recorder = live_run(tmp_path)
    write_report(store.files(run_id), report(run_id, [CACHE, PREFETCH, PADDING], mfu=MFU, marks=MARKS))
    app = AdviceApp(RunModel(run_id=run_id, job="fit", status="running"))
    try:
        async with app.run_test(size=SIZE) as pilot:
            view = app.query_one(RunView)
            assert not tab_listed(app), "no Advice tab before anything was read"
            view.follow_advice(store.files(run_id), live=True)
            await settle(pilot, lambda: "padding" in body(app))
            assert tab_listed(app)
            text = body(app)
            lines = text.splitlines()
            order = [line.split()[1] for line in lines if line[:1] in ("▲", "?", "✓")]
            assert order[:2] == ["padding", "prefetch"], "the firing rules first, in the rules' order"
            assert order[-1] == "cache" and len(order) == 11, "every rule once, the quiet one last"
            assert "? recompiles" in text and "not checked: nothing seen to judge" in text
            assert "fix: use layer widths that are multiples of 128" in text
            assert "fix: dataset = dataset.prefetch(tf.data.AUTOTUNE)" in text
            assert "✓ cache" in text and "the data is cached" in text
            assert "2 rules fire · 8 rules not checked · 1 rule quiet" in text
            assert "MFU 22.9 %" in text and "peak: measured: matmul check" in text
            assert "FLOPs per step: XLA cost analysis" in text
            assert "Traces and compilations (2)" in text
            assert "step     30  one_step_on_data ×2  input signature (64, 28, 28) after (100, 28, 28)" in text
            rendered = app.query_one("#advice-body", Static).content
            styles = {str(span.style) for span in rendered.spans}
            assert STATE_MARKS["fires"][1] in styles and FIX_STYLE in styles and STATE_MARKS["quiet"][1] in styles
            # a firing rule's summary wraps under itself, not under its mark, in a narrow pane
            assert all(not line.startswith("would") for line in lines)
    finally:
        recorder.close()


async def test_the_header_says_the_hint_while_a_rule_fires_and_drops_it_when_none_does(tmp_path, fast_reads):
    store, run_id, recorder = live_run(tmp_path)
    files = store.files(run_id)
    write_report(files, report(run_id, [PADDING, PREFETCH, CACHE], mfu=MFU))
    model = RunModel(run_id=run_id, job="fit", status="running")
    app = AdviceApp(model)
    try:
        async with app.run_test(size=(80, 30)) as pilot:
            app.query_one(RunView).follow_advice(files, live=True)
            await settle(pilot, lambda: header_line(app, "advice") is not None)
            hint = header_line(app, "advice")
            assert hint is not None and hint.startswith("advice: would waste 92 % of the matrix unit")
            assert hint.endswith("(a: Advice tab)") and len(hint) <= 80 - 2, "cut to 80 columns, the key kept"
            assert "…" in hint  # the hint itself ("… (+1 more)") is what was cut
            assert header_line(app, "rate") == "MFU 22.9 %"
            quiet = Advice("padding", "quiet", "model and batch sizes fill the matrix unit")
            write_report(files, report(run_id, [quiet, CACHE], mfu=MFU))
            await settle(pilot, lambda: header_line(app, "advice") is None)
            assert header_line(app, "rate") == "MFU 22.9 %", "the MFU stays"
    finally:
        recorder.close()


async def test_the_header_shows_mfu_beside_examples_per_second_from_the_runs_metrics_without_advice(
    tmp_path, fast_reads
):
    store, run_id, recorder = live_run(tmp_path)
    model = RunModel(run_id=run_id, job="fit", status="running")
    app = AdviceApp(model)
    try:
        async with app.run_test(size=SIZE) as pilot:
            view = app.query_one(RunView)
            view.follow_advice(store.files(run_id), live=True)
            await pilot.pause()
            assert header_line(app, "rate") is None, "no MFU, no line"
            model.apply(Metric("examples_per_second", 1185.0, 30, epoch=0))
            model.apply(Metric("mfu", 0.0731, 30, epoch=0))
            await settle(pilot, lambda: header_line(app, "rate") is not None)
            assert header_line(app, "rate") == "1185 examples/s · MFU 7.31 %"
            # advice.json's MFU, when it has one, is the newest word
            write_report(store.files(run_id), report(run_id, [CACHE], mfu=MFU))
            await settle(pilot, lambda: header_line(app, "rate") == "1185 examples/s · MFU 22.9 %")
    finally:
        recorder.close()


async def test_a_live_runs_rate_and_its_advice_read_again_unchanged_never_lay_the_screen_out(
    tmp_path, fast_reads, monkeypatch, screen_layouts
):
    # A live run's advice.json is read every two seconds (its writer replaces it once an epoch) and its rate
    # changes every epoch: laying the screen out for either repaints every widget on it, CPU taken from the
    # training beside the dashboard.
    store, run_id, recorder = live_run(tmp_path)
    files = store.files(run_id)
    write_report(files, report(run_id, [PADDING, CACHE], mfu=MFU))
    model = RunModel(run_id=run_id, job="fit", status="running")
    model.apply(Metric("examples_per_second", 1185.0, 30, epoch=0))
    reads: list[float] = []
    read = AdviceFeed.read
    monkeypatch.setattr(AdviceFeed, "read", lambda feed: reads.append(1.0) or read(feed))
    layouts = screen_layouts
    app = AdviceApp(model)
    try:
        async with app.run_test(size=SIZE) as pilot:
            app.query_one(RunView).follow_advice(files, live=True)
            await settle(pilot, lambda: header_line(app, "rate") == "1185 examples/s · MFU 22.9 %")
            await settle(pilot, lambda: "padding" in body(app))
            await pilot.pause()
            shown = body(app)
            layouts.clear()

            model.apply(Metric("examples_per_second", 1250.0, 60, epoch=1))
            read_before = len(reads)
            await settle(pilot, lambda: len(reads) >= read_before + 2 and "1250" in (header_line(app, "rate") or ""))
            await pilot.pause()
            assert header_line(app, "rate") == "1250 examples/s · MFU 22.9 %"
            assert body(app) == shown
            assert layouts == []
    finally:
        recorder.close()


async def test_new_advice_read_while_another_tab_is_shown_lays_nothing_out_and_shows_whole_when_opened(
    tmp_path, fast_reads, screen_layouts
):
    # A live run's advice moves with its figures: each new text laid the whole screen out (every widget repainted)
    # while the user looked at the plots, taking CPU from the training beside the dashboard (issue 37).
    store, run_id, recorder = live_run(tmp_path)
    files = store.files(run_id)
    write_report(files, report(run_id, [PADDING], mfu=MFU))
    app = AdviceApp(RunModel(run_id=run_id, job="fit", status="running"))
    try:
        async with app.run_test(size=SIZE) as pilot:
            view = app.query_one(RunView)
            view.follow_advice(files, live=True)
            await settle(pilot, lambda: "padding" in body(app) and tab_listed(app))
            await pilot.pause()
            assert app.query_one("#run-tabs", TabbedContent).active != ADVICE_PANE
            screen_layouts.clear()

            write_report(files, report(run_id, [PADDING, PREFETCH, CACHE], mfu=MFU))  # the header unchanged
            await settle(pilot, lambda: "cache" in body(app))
            await pilot.pause()
            assert screen_layouts == []

            view.open_advice()
            advice = app.query_one("#advice-body", Static)
            lines = len(body(app).splitlines())
            await settle(pilot, lambda: advice.size.height == lines)  # every line of the new text, none cut off
            assert lines > 3
    finally:
        recorder.close()


async def test_a_run_without_advice_says_why_and_an_unreadable_file_says_what_is_wrong(tmp_path, fast_reads):
    store, run_id, recorder = live_run(tmp_path, job="matmul")
    app = AdviceApp(RunModel(run_id=run_id, job="matmul", status="running"))
    try:
        async with app.run_test(size=SIZE) as pilot:
            view = app.query_one(RunView)
            view.follow_advice(store.files(run_id), live=True)
            await settle(pilot, lambda: view.advice_tab().read)
            assert not tab_listed(app), "a run without advice lists no Advice tab"
            view.open_advice()  # what a on the run screens does
            await pilot.pause()
            assert tab_listed(app) and app.query_one("#run-tabs", TabbedContent).active == ADVICE_PANE
            assert body(app) == (
                "No advice recorded for this run: it was recorded before tpudash judged runs (advice.json), "
                "or by a job without a model to judge (matmul, gradient descent)."
            )
            (tmp_path / "runs" / run_id / ADVICE_FILE).write_text('{"run_id": "x", "updated": 1.0, "advice": 3}')
            await settle(pilot, lambda: "could not be read" in body(app))
            assert body(app) == "The run's advice could not be read: advice.json: advice must be a list"
            assert header_line(app, "advice") is None and header_line(app, "rate") is None
    finally:
        recorder.close()


async def test_an_ended_bucket_run_is_read_once_through_its_run_files(tmp_path):
    store = RunStore(f"memory://advice-{uuid.uuid4().hex[:8]}/runs", spill_root=tmp_path / "unsent")
    run_id = new_run_id("fit")
    recorder = store.create(run_id, "fit", {}, {"kind": "CPU"})
    recorder.record(RunFinished(status="done", summary={}))
    recorder.close()
    files = store.files(run_id)
    assert files.local_dir is None
    write_report(files, report(run_id, [PADDING], mfu=MFU, marks=MARKS))
    reads: list[str] = []

    class Counted:
        """The run's files, counting the reads of advice.json."""

        where, local_dir = files.where, None

        def read(self, name, max_bytes):
            reads.append(name)
            return files.read(name, max_bytes)

    app = AdviceApp(RunModel(run_id=run_id, job="fit", status="done"))
    async with app.run_test(size=SIZE) as pilot:
        view = app.query_one(RunView)
        view.follow_advice(Counted(), live=False)  # type: ignore[arg-type]
        await settle(pilot, lambda: "padding" in body(app))
        for _ in range(20):  # beats go by: an ended run is not read again
            view.sync(force=True)
            await pilot.pause(0.01)
        assert reads == [ADVICE_FILE]


def test_a_live_runs_advice_is_read_at_most_every_two_seconds_and_once_more_when_it_ends(tmp_path):
    store, run_id, recorder = live_run(tmp_path)
    recorder.close()
    feed = AdviceFeed(store.files(run_id), live=True)
    assert feed.due() and feed.interval == 2.0
    feed.begin()
    assert not feed.due(), "one read at a time"
    assert feed.read() is None  # no advice.json yet
    now = time.monotonic()
    assert not feed.due(now + 1.9) and feed.due(now + 2.1)
    feed.ended()
    assert feed.due(now), "the run ended: its last word is read at once"
    feed.begin()
    feed.read()
    assert not feed.due(now + 3600.0), "and never again"


async def test_recompiles_are_marked_on_the_metric_plots_step_axis(tmp_path, fast_reads):
    store, run_id, recorder = live_run(tmp_path)
    model = RunModel(run_id=run_id, job="fit", status="running")
    for step in range(60):
        model.apply(Metric("batch_loss", 2.0 - step / 60, step, epoch=step // 30))
    app = AdviceApp(model)
    try:
        async with app.run_test(size=SIZE) as pilot:
            view = app.query_one(RunView)
            view.follow_advice(store.files(run_id), live=True)
            await settle(pilot, lambda: view.plot_for("loss") is not None)
            plot = view.plot_for("loss")
            assert isinstance(plot, MetricPlot)
            await plots_drawn(app.screen)
            assert plot.drawn_marks == () and RECOMPILE_LABEL not in str(plot.render())
            write_report(store.files(run_id), report(run_id, [CACHE], marks=MARKS))
            await settle(pilot, lambda: plot.drawn_marks == (30.0,))  # the first compile is no recompile
            await plots_drawn(app.screen)
            drawn = str(plot.render())
            assert RECOMPILE_LABEL in drawn
            assert drawn.count("│") >= plot.size.height - 6, "a vertical line across the canvas"
    finally:
        recorder.close()


async def test_a_in_the_dashboard_opens_the_advice_tab_of_a_run_from_history(tmp_path):
    from screens.run_detail import RunDetailScreen
    from tests.functional.test_snapshots import DESCRIPTION
    from tpudash.accel.description import Runtime
    from tpudash.config import Settings
    from tpudash.engine.inthread import EngineThread
    from tpudash.tui.app import TpudashApp

    runs_dir = tmp_path / "runs"
    store = RunStore(runs_dir)
    run_id = new_run_id("fit")
    ended = store.create(run_id, "fit", {}, {"kind": "CPU"})
    ended.record(RunFinished(status="done", summary={}))
    ended.close()
    write_report(store.files(run_id), report(run_id, [PADDING], mfu=MFU))
    settings = Settings(cpu_devices=8, runs_dir=runs_dir, data_dir=tmp_path / "tfds", telemetry_interval=0)
    runtime = Runtime(strategy=None, description=DESCRIPTION)
    app = TpudashApp(settings, engine_factory=lambda listener: EngineThread(listener, settings, {}, lambda: runtime))
    async with app.run_test(size=(80, 24)) as pilot:
        screen = RunDetailScreen(run_id)
        await app.push_screen(screen)
        await settle(pilot, lambda: screen.loaded)
        await settle(pilot, lambda: screen.view.advice is not None)
        hint = str(screen.query_one("#run-advice", Static).content)
        assert hint.startswith("advice: would waste 92 %") and hint.endswith("(a: Advice tab)")
        assert screen.query_one("#run-tabs", TabbedContent).active != ADVICE_PANE
        await pilot.press("a")
        await pilot.pause()
        assert screen.query_one("#run-tabs", TabbedContent).active == ADVICE_PANE
        assert "▲ padding" in str(screen.query_one("#advice-body", Static).content)

        # The palette's "Advice for this run" is a of the run on screen; elsewhere it says where to go first.
        from tpudash.tui.palette import TpudashCommands

        screen.query_one("#run-tabs", TabbedContent).active = "tab-log"
        command = next(entry for entry in TpudashCommands(app.screen)._commands() if entry[0] == "Advice for this run")
        command[1]()
        await pilot.pause()
        assert screen.query_one("#run-tabs", TabbedContent).active == ADVICE_PANE
        app.pop_screen()
        await pilot.pause()
        command[1]()
        await pilot.pause()
        assert any("Open a run first" in str(notice.message) for notice in app._notifications)


async def test_input_bound_left_to_readers_is_judged_from_the_runs_newest_profile(tmp_path, fast_reads):
    """The writer leaves ``input-bound`` to readers (they have telemetry and profiles): judged at each read."""
    import json
    import shutil
    from pathlib import Path

    stored = json.loads((Path(__file__).parent / "advice_reports" / "pitfalls.json").read_text())
    store, run_id, recorder = live_run(tmp_path)
    stored["run_id"] = run_id
    write_report(store.files(run_id), AdviceReport.from_json(stored))
    app = AdviceApp(RunModel(run_id=run_id, job="fit", status="running"))
    try:
        async with app.run_test(size=SIZE) as pilot:
            view = app.query_one(RunView)
            view.follow_advice(store.files(run_id), live=True)
            await settle(pilot, lambda: "input-bound" in body(app))
            assert "? input-bound" in body(app) and "not checked: no duty-cycle reading or profile yet" in body(app)
            # A profile of the run lands (what p or `tpudash profile` leaves): an input-bound Keras fit's summary.
            capture = tmp_path / "runs" / run_id / "profile" / "plugins" / "profile" / "2026_11_28_08_27_43"
            capture.mkdir(parents=True)
            (capture / "vm.xplane.pb").write_bytes(b"xplane")
            shutil.copy(Path(__file__).parent / "profile_summaries" / "input_bound.json", capture / "summary.json")
            await settle(pilot, lambda: "▲ input-bound" in body(app))
            assert "input-bound: 95 % of step time waits on input" in body(app)
            assert view.advice is not None and len(view.advice.firing()) == 7
    finally:
        recorder.close()


async def test_a_on_the_run_screen_opens_the_advice_of_the_engines_run_read_live_then_once_at_its_end(tmp_path):
    from screens.run import RunScreen
    from tests.functional.conftest import JobGate, _steps_job, run_settled, until
    from tests.functional.test_snapshots import DESCRIPTION
    from tpudash.accel.description import Runtime
    from tpudash.config import Settings
    from tpudash.engine.inthread import thread_engine_factory
    from tpudash.tui.app import TpudashApp

    gate = JobGate()
    specs = {"test-steps": _steps_job(gate)}  # no TensorFlow: a job that emits losses, held half way
    settings = Settings(cpu_devices=8, runs_dir=tmp_path / "runs", data_dir=tmp_path / "tfds", telemetry_interval=0)
    runtime = Runtime(strategy=None, description=DESCRIPTION)
    app = TpudashApp(settings, job_specs=specs, engine_factory=thread_engine_factory(settings, specs, lambda: runtime))
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await app.runtime_settled.wait()
            live = app.session.launch_by_name("test-steps", {"steps": "40"})
            await until(pilot, lambda: gate.reached.is_set())
            files = RunStore(tmp_path / "runs").files(live.run_id)
            write_report(files, report(live.run_id, [PADDING], mfu=MFU))  # what the run's writer does
            screen = app.screen
            assert isinstance(screen, RunScreen)

            def header(name: str) -> str | None:
                line = screen.query_one(f"#run-{name}", Static)
                return str(line.content) if line.display else None

            def advice_body() -> str:
                return str(screen.query_one("#advice-body", Static).content)

            await until(pilot, lambda: header("advice") is not None)  # read at most 2 s after the last read
            assert header("rate") == "MFU 22.9 %"
            await pilot.press("a")
            await pilot.pause()
            assert screen.query_one("#run-tabs", TabbedContent).active == ADVICE_PANE
            assert "▲ padding" in advice_body()
            # Its last word, written as the run ends, is read once it has ended.
            write_report(files, report(live.run_id, [Advice("padding", "quiet", "model and batch sizes fill it")]))
            gate.release.set()
            await run_settled(pilot, live)
            await until(pilot, lambda: "✓ padding" in advice_body())
            assert header("advice") is None
    finally:
        gate.release.set()
