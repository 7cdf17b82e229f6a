"""The History screen: the runs just made, opening one, overlaying two, CSV export, corrupt runs."""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
from pathlib import Path

import pytest
from textual import events
from textual.geometry import Size
from textual.widgets import DataTable, Static

from screens.devices import DevicesScreen
from screens.history import HistoryScreen
from screens.overlay import OverlayScreen
from screens.run_detail import RunDetailScreen
from screens.stored_runs import RunsLoaded, follow_run
from tests.crafted_runs import CRAFTED, GOOD, craft_runs
from tests.functional.conftest import SIZE, UNTIL_TIMEOUT, run_settled, runtime_ready, type_ahead, until
from tpudash.tui.dialogs import ConfirmScreen
from tpudash.tui.runview import RunView


def history_rows(screen: HistoryScreen) -> list[list]:
    table = screen.query_one("#history-table", DataTable)
    return [table.get_row_at(index) for index in range(table.row_count)]


async def open_history(pilot, expected_rows: int) -> HistoryScreen:
    await pilot.press("h")
    screen = pilot.app.screen
    assert isinstance(screen, HistoryScreen)
    await pilot.app.workers.wait_for_complete()
    await until(pilot, lambda: screen.query_one("#history-table", DataTable).row_count == expected_rows)
    return screen


async def test_history_lists_the_runs_just_made_and_opens_one(make_app, job_gate):
    job_gate.release.set()
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await runtime_ready(pilot)
        await pilot.press("g")
        await run_settled(pilot, app.session.live_runs[app.shown_run_id])
        await run_settled(pilot, app.session.launch_by_name("test-fails"))
        screen = await open_history(pilot, 2)
        rows = history_rows(screen)
        assert [row[2] for row in rows] == ["test-fails", "gradient-descent"]  # newest first
        assert [str(row[3]) for row in rows] == ["✗ failed", "✓ done"]
        assert "loss=0.00225969" in rows[1][5]

        await pilot.press("down", "enter")
        detail = app.screen
        assert isinstance(detail, RunDetailScreen)
        await app.workers.wait_for_complete()
        await until(pilot, lambda: detail.loaded and detail.view.plot_for("loss") is not None)
        assert detail.view.model.job == "gradient-descent"
        assert (
            detail.view.plot_for("loss").points_drawn == detail.view.model.tracks[("loss", "train", "step")].count >= 20
        )
        assert "0.0022596875205636024" in str(detail.view.query_one("#run-outcome", Static).content)
        # e exports the run on show as History's e does, into its run directory.
        await pilot.press("e")
        await app.workers.wait_for_complete()
        exported = app.session.store.find(detail.run_id) / "metrics.csv"
        await until(pilot, lambda: any(str(exported) in message for _, _, message in app.notices))
        assert exported.read_text().splitlines()[0] == "time,name,split,step,epoch,value"
        await pilot.press("escape")
        assert app.screen is screen


async def test_two_marked_runs_overlay_their_loss_and_export_writes_csv(make_app, job_gate, isolated_runs_dir):
    job_gate.release.set()
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await runtime_ready(pilot)
        first = app.session.launch_by_name("test-steps", {"steps": "10"})
        second = app.session.launch_by_name("test-steps", {"steps": "30"})
        await run_settled(pilot, first)
        await run_settled(pilot, second)
        screen = await open_history(pilot, 2)
        await pilot.press("space", "down", "space")
        assert [str(row[0]) for row in history_rows(screen)] == ["✓", "✓"]
        await pilot.press("o")
        overlay = app.screen
        assert isinstance(overlay, OverlayScreen)
        await app.workers.wait_for_complete()
        await until(pilot, lambda: len(overlay.plot.lines) == 4)
        labels = [line.label for line in overlay.plot.lines]
        assert labels == [
            f"test-steps {second.run_id[-6:]} train",
            f"test-steps {second.run_id[-6:]} held-out",
            f"test-steps {first.run_id[-6:]} train",
            f"test-steps {first.run_id[-6:]} held-out",
        ]
        await pilot.press("escape")

        await pilot.press("e")
        await app.workers.wait_for_complete()
        await pilot.pause()
        exported = isolated_runs_dir / first.run_id / "metrics.csv"
        header, *rows = exported.read_text().splitlines()
        assert header == "time,name,split,step,epoch,value"
        # the run's 10 steps and its held-out point; telemetry sampled while it ran is exported too, on its own rows
        splits = [row.split(",")[2] for row in rows]
        assert [split for split in splits if split != "telemetry"] == ["train"] * 10 + ["val"]
        assert any(str(exported) in message for _, _, message in app.notices)


async def test_corrupt_runs_still_list_and_show_what_they_can(make_app, isolated_runs_dir):
    broken = isolated_runs_dir / "20260101-000000-train-abcdef"
    broken.mkdir(parents=True)
    (broken / "run.json").write_text("{not json")
    started = {
        "type": "run_started",
        "t": 1.0,
        "run_id": broken.name,
        "job": "train",
        "params": {},
        "runtime": {},
        "time": 1.0,
    }
    metric = {"type": "metric", "t": 2.0, "name": "batch_loss", "value": 0.5, "step": 1, "epoch": 0, "split": "train"}
    (broken / "events.jsonl").write_text(json.dumps(started) + "\n" + json.dumps(metric) + "\n" + '{"type": "metr')
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_history(pilot, 1)
        row = history_rows(screen)[0]
        assert row[2] == "train" and str(row[3]) == "! interrupted"
        assert str(row[6]) == "⚠ 2"
        await pilot.press("enter")
        detail = app.screen
        await app.workers.wait_for_complete()
        await until(pilot, lambda: detail.loaded)
        problems = str(detail.query_one("#detail-problems", Static).content)
        assert "run.json: unreadable" in problems and "line 3: truncated" in problems
        assert detail.view.model.tracks[("loss", "train", "batch")].last == 0.5


async def test_every_hostile_run_lists_opens_and_says_what_is_wrong(make_app, isolated_runs_dir):
    """Runs written by anyone: wrong types, huge numbers, a FIFO, a link to /dev/zero, a cut-off last line.

    History lists all of them at once, each opens with its problem named, the
    good one shows its whole loss curve, and the dashboard stays up throughout.
    """
    craft_runs(isolated_runs_dir)
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_history(pilot, len(CRAFTED) + 1)
        assert set(screen.runs) == {GOOD, *CRAFTED}
        started = {run_id: row[1] for run_id, row in zip(screen.runs, history_rows(screen), strict=True)}
        assert started["20261125-100004-train-st1e300"] == "?"  # a time no clock can show
        for run_id, problem in CRAFTED.items():
            detail = RunDetailScreen(run_id)
            await app.push_screen(detail)
            await app.workers.wait_for_complete()
            await until(pilot, lambda shown=detail: shown.loaded)
            shown = str(detail.query_one("#detail-problems", Static).content)
            assert problem in shown, (run_id, shown)
            await pilot.press("escape")
        detail = RunDetailScreen(GOOD)
        await app.push_screen(detail)
        await app.workers.wait_for_complete()
        await until(pilot, lambda: detail.loaded and detail.view.plot_for("loss") is not None)
        assert [track.count for track in detail.view.model.tracks.values()] == [20]
        assert not detail.view.model.problems
        assert app.is_running


async def test_a_listing_that_started_before_a_run_ended_never_shows_after_one_that_saw_it_end(make_app):
    """On a loaded machine an older listing's thread may finish last: its stale "● live" must not stay on screen."""
    from tpudash.runs.store import RunInfo

    def listed(status: str, live: bool) -> list[RunInfo]:
        return [RunInfo(run_id="20261128-010101-fit-0a0b0c", path="/nowhere", job="fit", status=status, live=live)]

    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_history(pilot, 0)
        first_may_return = threading.Event()
        calls: list[str] = []

        def list_runs() -> list[RunInfo]:
            calls.append("started")
            if len(calls) == 1:  # read while the run was live; its thread is slow to finish
                assert first_may_return.wait(UNTIL_TIMEOUT)
                return listed("running", live=True)
            return listed("interrupted", live=False)  # read after its writer died

        app.session.store.list_runs = list_runs
        screen.action_reload()  # the run's last change
        screen.action_reload()  # its end, heard while the first listing still runs
        screen.action_reload()
        first_may_return.set()
        # The stale listing shows first, then the one that saw the end, and it stays.
        await until(pilot, lambda: [str(row[3]) for row in history_rows(screen)] == ["! interrupted"])
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert [str(row[3]) for row in history_rows(screen)] == ["! interrupted"]
        assert len(calls) == 2  # the reloads asked for meanwhile were one listing, not a thread each


async def test_a_relisting_of_many_runs_updates_the_rows_that_changed_and_refills_only_for_a_new_run(make_app):
    """A bucket of thousands of runs re-listed on every visit: refilling the table each time held up the next key."""
    from tpudash.runs.store import RunInfo

    def run(index: int, status: str = "done", live: bool = False) -> RunInfo:
        return RunInfo(
            run_id=f"20261128-01{index // 60:02d}{index % 60:02d}-fit-{index:06x}",
            path="/nowhere",
            job=f"fit-{index}",
            status=status,
            live=live,
            started=1_795_000_000.0 + index,
        )

    listings = [
        [run(index) for index in range(299)] + [run(299, "running", live=True)],
        [run(index) for index in range(299)] + [run(299, "interrupted")],  # the live one's writer died
        [run(index) for index in range(301)],  # a new run appeared
    ]
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_history(pilot, 0)
        table = screen.query_one("#history-table", DataTable)
        app.session.store.list_runs = lambda: listings[0]
        screen.action_reload()
        await until(pilot, lambda: table.row_count == 300)
        assert str(history_rows(screen)[0][3]) == "● live"
        table.move_cursor(row=5)
        rows_added: list[object] = []
        add_row = table.add_row
        table.add_row = lambda *cells, **options: rows_added.append(options.get("key")) or add_row(*cells, **options)

        app.session.store.list_runs = lambda: listings[1]
        screen.action_reload()
        await until(pilot, lambda: str(history_rows(screen)[0][3]) == "! interrupted")
        assert rows_added == []  # one cell changed: the other 299 rows were left as they were
        assert screen.highlighted_run_id == run(294).run_id  # and the cursor where the user left it

        app.session.store.list_runs = lambda: listings[2]
        screen.action_reload()
        await until(pilot, lambda: table.row_count == 301)
        assert history_rows(screen)[0][2] == "fit-300" and len(rows_added) == 301  # newest first: a refill
        assert screen.highlighted_run_id == run(294).run_id


async def test_history_shown_again_with_the_same_runs_is_not_laid_out_and_counts_a_new_run(make_app, screen_layouts):
    """Each visit lists the runs again; the same title again laid the whole screen out, a key's frame of time."""
    from tpudash.runs.store import RunInfo

    def runs(count: int) -> list[RunInfo]:
        return [
            RunInfo(run_id=f"20261128-0100{index:02d}-fit-{index:06x}", path="/nowhere", job="fit", status="done")
            for index in range(count)
        ]

    layouts = screen_layouts
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        listing = runs(3)
        app.session.store.list_runs = lambda: listing
        screen = await open_history(pilot, 3)
        title = screen.query_one("#history-title", Static)
        assert str(title.content).startswith("3 runs in ")
        await pilot.press("d")
        await pilot.pause()
        layouts.clear()
        await pilot.press("h")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert "HistoryScreen" not in layouts

        listing = runs(4)
        await pilot.press("d", "h")
        await until(pilot, lambda: screen.query_one("#history-table", DataTable).row_count == 4)
        assert str(title.content).startswith("4 runs in ")


async def test_a_run_or_question_closed_before_it_has_drawn_raises_nothing(make_app, isolated_runs_dir):
    # Keys typed ahead (enter then escape in History; q then n) close a screen while it is still
    # mounting; it must not reach for widgets Textual has already taken down.
    craft_runs(isolated_runs_dir)
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await runtime_ready(pilot)
        for _ in range(5):
            app.push_screen(RunDetailScreen(GOOD))
            app.pop_screen()
            app.push_screen(ConfirmScreen("Quit?"))
            app.pop_screen()
            await pilot.pause()
        detail = RunDetailScreen(GOOD)
        await app.push_screen(detail)
        await app.workers.wait_for_complete()
        await until(pilot, lambda: detail.loaded and detail.view.plot_for("loss") is not None)
        assert app.is_running


class RunViewComposedLate(RunView):
    """A run view whose own composing waits for ``go``: a loaded machine runs the screen's close first."""

    def __init__(self, started: asyncio.Event, go: asyncio.Event, **kwargs):
        super().__init__(**kwargs)
        self.started, self.go = started, go

    async def _pre_process(self) -> bool:
        self.started.set()
        await self.go.wait()
        return await super()._pre_process()


class RunLoadedAtOnce(RunDetailScreen):
    """The run detail with that run view, whose load lands at once (a small run read by an idle worker)."""

    CSS_PATH = Path(inspect.getfile(RunDetailScreen)).with_name(str(RunDetailScreen.CSS_PATH))

    def __init__(self, run_id: str):
        super().__init__(run_id)
        self.view_started, self.view_go = asyncio.Event(), asyncio.Event()

    def compose_body(self):
        for widget in super().compose_body():
            yield (
                RunViewComposedLate(self.view_started, self.view_go, id=widget.id)
                if isinstance(widget, RunView)
                else widget
            )

    def load(self) -> None:  # type: ignore[override]
        self.post_message(RunsLoaded([follow_run(self.dashboard.session.store, self.run_id)]))


@pytest.mark.parametrize("queued_for_the_view", ["nothing", "a resize"])
async def test_a_run_left_while_its_view_still_composes_raises_nothing_when_its_load_lands(
    make_app, isolated_runs_dir, queued_for_the_view
):
    # The orders two CI runs produced: escape (or the app's exit) closed the run while its run view was still to
    # compose, so the view mounted with no parts; the run's load landed in the screen's queue before the close did,
    # or a layout's resize in the view's own queue.
    craft_runs(isolated_runs_dir)
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await runtime_ready(pilot)
        prune = app._prune

        def prune_then_compose(*nodes, parent=None):
            pruned = prune(*nodes, parent=parent)
            for node in nodes:
                if isinstance(node, RunLoadedAtOnce):
                    if queued_for_the_view == "a resize":
                        node.view.post_message(events.Resize(Size(80, 30), Size(80, 30)))
                    node.view_go.set()
            return pruned

        app._prune = prune_then_compose
        detail = RunLoadedAtOnce(GOOD)
        try:
            app.push_screen(detail)
            await asyncio.wait_for(detail.view_started.wait(), UNTIL_TIMEOUT)
            await asyncio.wait_for(app.pop_screen(), UNTIL_TIMEOUT)
            assert detail.view_go.is_set() and not detail.is_attached
        finally:
            detail.view_go.set()  # a failure above must not leave the app's shutdown waiting on the view
        assert app.is_running and app._exception is None
        # And the next run opened draws as ever.
        again = RunDetailScreen(GOOD)
        await app.push_screen(again)
        await app.workers.wait_for_complete()
        await until(pilot, lambda: again.loaded and again.view.plot_for("loss") is not None)


async def test_a_run_opened_then_left_at_once_leaves_the_next_screen_in_charge(make_app, isolated_runs_dir):
    # Typed ahead: enter on a run, then d. The row's selection is a message History handles after the app
    # has already switched to Devices; the run must not open on top of Devices, where d could not leave it.
    craft_runs(isolated_runs_dir)
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await runtime_ready(pilot)
        await open_history(pilot, len(CRAFTED) + 1)
        type_ahead(app, "enter", "d")
        await pilot.pause()
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert isinstance(app.screen, DevicesScreen)
        await pilot.press("h")
        assert isinstance(app.screen, HistoryScreen)


async def test_a_screens_key_closes_a_run_opened_over_that_screen(make_app, isolated_runs_dir):
    # w opens another writer's live run over the screen it was pressed on; enter opens one over History.
    # The screen's own key leads back to it, as backspace does.
    craft_runs(isolated_runs_dir)
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await runtime_ready(pilot)
        await app.push_screen(RunDetailScreen(GOOD))
        await pilot.press("d")
        assert isinstance(app.screen, DevicesScreen) and len(app.screen_stack) == 1
        history = await open_history(pilot, len(CRAFTED) + 1)
        await pilot.press("enter")
        assert isinstance(app.screen, RunDetailScreen)
        await pilot.press("h")
        assert app.screen is history and len(app.screen_stack) == 1
