"""Animated widgets keep no timer while nothing they draw moves or can be seen.

A ``Spinner`` animates while it is displayed on the screen on show, and stops
when hidden, when its screen is left or when it is removed; a
``SteadyStatic`` lays the screen out only for a text of another height; a
``OneLineStatic`` draws its text's line without Textual's text layout, and
shows what Static shows, cell for cell.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import App, ComposeResult
from textual.containers import Horizontal
from textual.screen import Screen
from textual.strip import Strip
from textual.visual import Visual
from textual.widgets import Label, Static

from tpudash.format import status_text
from tpudash.tui.quiet_widgets import SPINNER_FRAME_SECONDS, OneLineStatic, Spinner, SteadyStatic


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


class LinesApp(App):
    CSS = "Static { height: 1; padding: 0 1; background: $panel; } #ellipsis-textual, #ellipsis-ours { text-wrap: nowrap; text-overflow: ellipsis; }"

    def compose(self) -> ComposeResult:
        yield Static("", id="textual")
        yield OneLineStatic("", id="ours")
        yield Static("", id="ellipsis-textual")
        yield OneLineStatic("", id="ellipsis-ours")


def shown(strip: Strip) -> list[tuple]:
    """Each cell as a terminal shows it (character, colours, attributes), and the offset mouse selection reads."""
    cells = []
    for segment in strip:
        style = segment.style
        assert style is not None
        offset = style.meta.get("offset")
        for index, character in enumerate(segment.text):
            attributes = tuple(bool(getattr(style, name)) for name in ("bold", "dim", "italic", "underline", "reverse"))
            cells.append((character, style.color, style.bgcolor, attributes, offset and (offset[0] + index, offset[1])))
    return cells


LINES = [
    Text.assemble(("tpudash", "bold"), "  ", ("CPU · 8 replicas", "cyan"), "  │  engine ", ("released", "dim")),
    Text.assemble(("tpudash", "bold"), "  ", ("TPU runtime failed: no TPU found", "bold red")),
    Text.assemble(
        ("train", "bold"), "  ", status_text("running"), ("  0:07", "bold"), ("   20261129-1412-train", "dim")
    ),
    Text.assemble(("train", "bold"), "  ", status_text("failed"), ("  1:02:07", "bold")),
    Text.assemble(("train", "bold"), "  ", status_text("running"), ("  0:07", "bold"), ("   " + "x" * 60, "dim")),
    Text("word " * 20),  # too wide: Textual shows the words that fit
    Text("y" * 80),  # one word too wide: folded
    Text("No run yet: press m, r or g.", style="dim"),
    Text.assemble(("a dim line", "dim"), " with a bold end", style="bold"),
    Text(""),
]


async def test_a_one_line_static_shows_what_a_static_shows_cell_for_cell():
    app = LinesApp()
    async with app.run_test(size=(48, 6)) as pilot:
        pairs = [("#textual", "#ours"), ("#ellipsis-textual", "#ellipsis-ours")]  # wrapped; cut with an ellipsis
        for theme in ("textual-dark", "textual-light"):
            app.theme = theme
            for line in LINES:
                for textual, ours in pairs:
                    app.query_one(textual, Static).update(line, layout=False)
                    app.query_one(ours, OneLineStatic).update(line, layout=False)
                await pilot.pause()
                strips = app.screen._compositor.render_strips()
                for row in (0, 2):
                    assert strips[row + 1].text == strips[row].text
                    assert shown(strips[row + 1]) == shown(strips[row]), f"{theme}: {line.plain!r}"
                if line.cell_len > 46:
                    assert strips[2].text.rstrip().endswith("…")


async def test_a_one_line_static_draws_without_textuals_text_layout_only_what_it_can_draw_so(monkeypatch):
    app = LinesApp()
    async with app.run_test(size=(48, 6)) as pilot:
        laid_out: list[str | None] = []
        to_strips = Visual.to_strips

        def noted(widget, *args, **kwargs):
            laid_out.append(widget.id)
            return to_strips(widget, *args, **kwargs)

        monkeypatch.setattr(Visual, "to_strips", staticmethod(noted))
        ours, ellipsis = app.query_one("#ours", OneLineStatic), app.query_one("#ellipsis-ours", OneLineStatic)
        ours.update(LINES[2], layout=False)
        ellipsis.update(LINES[4], layout=False)
        await pilot.pause()
        assert "ours" not in laid_out and "ellipsis-ours" not in laid_out
        # Aligned otherwise, or given markup rather than a Text: drawn by Static, as Static draws it.
        ellipsis.styles.text_align = "right"
        ellipsis.refresh()
        await pilot.pause()
        assert "ellipsis-ours" in laid_out
        laid_out.clear()
        ours.update("[b]markup[/b]", layout=False)
        await pilot.pause()
        assert "ours" in laid_out and "markup" in app.screen._compositor.render_strips()[1].text
        laid_out.clear()
        ours.update(Text("all of it dim", style="dim"), layout=False)  # Textual blends that style into its colours
        await pilot.pause()
        assert "ours" in laid_out
