"""Animated widgets keep no timer while nothing they draw moves or can be seen.

A ``Spinner`` animates while it is displayed on the screen on show, and stops
when hidden, when its screen is left or when it is removed; a
``SteadyStatic`` lays the screen out only for a text of another height.
"""

from __future__ import annotations

from textual.app import App, ComposeResult
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Label

from tpudash.tui.quiet_widgets import SPINNER_FRAME_SECONDS, Spinner, SteadyStatic


class SpinnerScreen(Screen):
    def compose(self) -> ComposeResult:
        yield Spinner(id="spinner")
        yield Label("under the spinner")


class SpinnerApp(App):
    MODES = {"spinning": SpinnerScreen, "other": lambda: Screen()}
    DEFAULT_MODE = "spinning"


async def _until(pilot, condition) -> None:
    for _ in range(50):  # bounded: each pause lets the app handle what the last step caused
        if condition():
            return
        await pilot.pause()
    raise AssertionError("the condition never held")


async def test_a_spinner_animates_only_while_it_is_displayed_on_the_screen_on_show():
    app = SpinnerApp()
    async with app.run_test(size=(40, 8)) as pilot:
        spinner = app.screen.query_one(Spinner)
        await _until(pilot, lambda: spinner.animating)
        assert spinner.auto_refresh == SPINNER_FRAME_SECONDS
        await app.switch_mode("other")
        await _until(pilot, lambda: not spinner.animating)
        await app.switch_mode("spinning")
        await _until(pilot, lambda: spinner.animating)
        spinner.display = False  # the runtime answered: the Devices screen hides it
        await _until(pilot, lambda: not spinner.animating)
        spinner.display = True
        await _until(pilot, lambda: spinner.animating)


async def test_a_spinner_hidden_before_its_first_frame_never_starts_its_timer():
    app = SpinnerApp()
    async with app.run_test(size=(40, 8)) as pilot:
        spinner = Spinner()
        spinner.display = False
        await app.screen.mount(spinner)
        await pilot.pause()
        await pilot.pause()
        assert not spinner.animating


class SteadyApp(App):
    CSS = "SteadyStatic { height: auto; }"

    def compose(self) -> ComposeResult:
        yield SteadyStatic("0.1s", id="line")
        yield Label("below", id="below")


async def test_a_steady_static_lays_out_only_for_a_text_of_another_height(screen_layouts):
    app = SteadyApp()
    async with app.run_test(size=(30, 8)) as pilot:
        line, below = app.query_one(SteadyStatic), app.query_one("#below")
        await pilot.pause()
        screen_layouts.clear()
        line.update("1.1s")  # a clock that moved: repainted in place
        await pilot.pause()
        assert screen_layouts == [] and line.render_line(0).text.rstrip() == "1.1s"
        line.update("a line far too long for the thirty columns")  # wraps: two lines, and what is below moves down
        await _until(pilot, lambda: below.region.y == 2)
        assert line.size.height == 2 and screen_layouts
        line.update("2.1s")
        await _until(pilot, lambda: below.region.y == 1)


class AutoWidthApp(App):
    CSS = "SteadyStatic { width: auto; height: auto; } Horizontal { height: 1; }"

    def compose(self) -> ComposeResult:
        with Horizontal():
            yield SteadyStatic("0.1s", id="line")
            yield Label("beside", id="beside")


async def test_a_steady_static_as_wide_as_its_text_follows_its_text_s_width():
    app = AutoWidthApp()
    async with app.run_test(size=(30, 8)) as pilot:
        line, beside = app.query_one(SteadyStatic), app.query_one("#beside")
        await _until(pilot, lambda: beside.region.x == 4)
        line.update("10.1s")  # one line still, but wider: what is beside it moves right
        await _until(pilot, lambda: beside.region.x == 5)
        line.update("0.2s")  # as high as before, and narrower: what is beside it moves back
        await _until(pilot, lambda: beside.region.x == 4)
        assert line.size.width == 4
