"""Keys in the Jobs screen's forms as a new user presses them: j lands on the job list, enter on a select opens
it, a burst of keys typed in one write keeps its order, and the dashboard's advice names the form's field."""

from __future__ import annotations

import re

from textual._xterm_parser import XTermParser
from textual.widgets import OptionList, Select, Switch

from jobs import datasets
from screens.history import HistoryScreen
from screens.jobs import JobsScreen
from tests.functional.conftest import SIZE, run_settled, runtime_ready, shown_live, type_ahead, until
from tests.functional.test_app_80x24 import screen_rows
from tpudash.tui.bars import KeyBar
from tpudash.tui.dialogs import ConfirmScreen
from tpudash.tui.paramform import ParamForm
from tpudash.tui.plots import plots_drawn


def keys_line(app) -> str:
    """The keys line as read, in lower case (its compact form lowers descriptions)."""
    return str(app.screen.query_one(KeyBar).render()).lower()


async def test_j_lands_on_the_job_list_after_a_launch_and_enter_there_opens_the_form(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await runtime_ready(pilot)
        await pilot.press("t")
        form = app.screen.current_form
        assert form.spec.name == "train" and app.focused is form.fields[0].input
        # Launch a small run from the form: the run view shows it.
        app.screen.select_job("gradient-descent")
        await pilot.press("enter")
        form = app.screen.current_form
        await until(pilot, lambda: app.focused is form.fields[0].input)
        form.field("learning_rate").input.focus()
        await pilot.pause()
        assert "⏎ launch" in keys_line(app)
        await pilot.press("enter")
        live = shown_live(app)
        await run_settled(pilot, live)
        await until(pilot, lambda: app.current_mode == "run")
        # Back with j: the cursor is on the job list, so down + enter does not launch the form again.
        await pilot.press("j")
        job_list = app.screen.query_one("#job-list", OptionList)
        assert app.focused is job_list
        assert "⏎ launch" not in keys_line(app) and "open form" in keys_line(app)
        await pilot.press("down", "enter")
        assert list(app.session.live_runs) == [live.run_id], "enter on the list launched a job"
        opened = app.screen.current_form
        assert app.focused is opened.fields[0].input and opened.spec.name != "gradient-descent"


async def test_enter_on_a_select_opens_its_list_and_on_a_switch_toggles_it_without_launching(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("j")
        screen: JobsScreen = app.screen
        screen.select_job("gradient-descent")
        await pilot.pause()
        form: ParamForm = screen.current_form
        optimizer = form.field("optimizer").input
        assert isinstance(optimizer, Select)
        optimizer.focus()
        await pilot.pause()
        assert "⏎ launch" not in keys_line(app) and "⏎ choose" in keys_line(app)
        await pilot.press("enter")
        assert optimizer.expanded, "enter did not open the select's list"
        await pilot.press("down", "enter")
        assert not optimizer.expanded and optimizer.value != "sgd"
        assert not app.session.live_runs and not app.session.busy
        screen.select_job("train")
        await pilot.pause()
        switch = screen.current_form.field("deterministic").input
        assert isinstance(switch, Switch)
        before = switch.value
        switch.focus()
        await pilot.pause()
        assert "⏎ toggle" in keys_line(app)
        await pilot.press("enter")
        assert switch.value is not before
        assert not app.session.live_runs and not app.session.busy


async def test_keys_typed_in_one_write_keep_their_order_across_a_tab(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("j")
        form: ParamForm = app.screen.current_form
        assert form.spec.name == "matmul"
        first, second = form.field("m").input, form.field("k").input
        first.value = second.value = ""
        first.focus()
        await pilot.pause()
        # One read of the terminal: the driver's parser turns it into keys, all queued before the app handles one.
        for event in XTermParser().feed("512\t256"):
            app.post_message(event)
        await until(pilot, lambda: len(first.value) + len(second.value) >= 6)
        assert (first.value, second.value) == ("512", "256")
        assert app.focused is second


async def test_the_dashboards_advice_for_missing_data_names_the_forms_field(make_app, monkeypatch):
    monkeypatch.setattr(datasets, "network_reachable", lambda hosts, **_: False)
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await runtime_ready(pilot)
        await pilot.press("t")
        form: ParamForm = app.screen.current_form
        form.set_value("source", "tfds")
        form.set_value("dataset", "mnist")
        form.field("epochs").input.focus()
        await pilot.pause()
        await pilot.press("enter")
        live = shown_live(app)
        await run_settled(pilot, live)
        assert live.model.status == "failed"
        assert "set the form's source field to synthetic" in live.model.error
        assert "--set" not in live.model.error


def clock_masked(row: str) -> str:
    """A row with its clocks (a running run's 00:01) blanked: they tick while the test looks."""
    return re.sub(r"\d\d:\d\d", "--:--", row)


async def test_the_quit_dialog_shows_over_the_screen_it_was_asked_on(make_app, job_gate):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await runtime_ready(pilot)
        live = app.session.launch_by_name("test-steps", {"steps": "1000"})
        await until(pilot, lambda: job_gate.reached.is_set() and app.current_mode == "run")
        await plots_drawn(app.screen)
        behind = screen_rows(app)
        await pilot.press("q")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        rows = screen_rows(app)
        await pilot.press("n")
        await until(pilot, lambda: not isinstance(app.screen, ConfirmScreen))
        await plots_drawn(app.screen)
        # What was behind the dialog: the screen before it, or after it (the run view may have drawn meanwhile).
        after = screen_rows(app)
        assert any("Cancel and quit" in row for row in rows)
        # The session bar and the run view's header stay readable around the dialog.
        assert clock_masked(rows[0]) == clock_masked(behind[0]) and "test-steps" in rows[0]
        kept = [
            row
            for row, before, later in zip(rows, behind, after)
            if before.strip() and clock_masked(row) in (clock_masked(before), clock_masked(later))
        ]
        assert len(kept) >= SIZE[1] // 2, "the screen behind the dialog is hidden"
        job_gate.release.set()
        await run_settled(pilot, live)


async def test_every_screen_draws_its_keys_line_in_one_style(make_app):
    for size in ((160, 48), (200, 50), (80, 24)):
        app = make_app()
        async with app.run_test(size=size) as pilot:
            drawn: dict[str, tuple[str, list]] = {}
            for key in ("d", "j", "h", "v", "l", "question_mark"):
                await pilot.press(key)
                await pilot.pause()
                bar = app.screen.query_one(KeyBar)
                line = bar.render()
                start, end, _ = next(span for span in bar.spans if span[2] == "d")
                # What a user sees of the d key: its characters and their styles, cell by cell.
                styles = [str(line.get_style_at_offset(app.console, offset)) for offset in range(start, end)]
                drawn[app.current_mode] = (line.plain[start:end], styles)
            assert len(set(map(repr, drawn.values()))) == 1, (size, drawn)


def test_every_screens_own_keys_fit_the_room_the_keys_line_keeps_for_them():
    import importlib

    from textual.binding import Binding

    from tpudash.tui.bars import ShownKey
    from tpudash.tui.modes import MODE_SCREENS, RUN_DETAIL_SCREEN

    classes = [(module, name) for module, name, *_ in MODE_SCREENS.values()] + [RUN_DETAIL_SCREEN]
    classes.append(("screens.overlay", "OverlayScreen"))
    for module_name, class_name in classes:
        screen_class = getattr(importlib.import_module(module_name), class_name)
        # One binding of a key is enabled at a time (the Jobs screen's enter): the widest one counts.
        widest: dict[str, int] = {}
        for binding in screen_class.BINDINGS:
            if isinstance(binding, Binding) and binding.show:
                width = ShownKey(binding.key, binding.key_display or binding.key, binding.description, True, 1).width(
                    False, True
                )
                widest[binding.key] = max(widest.get(binding.key, 0), width)
        assert sum(widest.values()) <= KeyBar.SCREEN_KEYS_ROOM, (class_name, widest)


async def test_a_screens_key_typed_right_after_a_launch_key_wins(make_app, job_gate):
    # A launch shows the Run view once the run is on its way; d typed before that must not be overruled.
    job_gate.release.set()
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await runtime_ready(pilot)
        type_ahead(app, "g", "h")
        await until(pilot, lambda: app.session.live_runs and isinstance(app.screen, HistoryScreen))
        await run_settled(pilot, shown_live(app))
        await pilot.pause()
        assert isinstance(app.screen, HistoryScreen)
        await pilot.press("g")
        assert app.current_mode == "run"  # a launch alone still shows its run
