"""ProgressLine (tpudash.tui.progressline) shows what Textual's own progress row showed, cell for cell, in one widget.

The row it replaces is kept here as the reference: a unit label, Textual's
``ProgressBar`` (bar and percentage, no ETA) and a label for the counts, in a
one-line container, as the run view drew it. Both sit in the same padded
column; each state is shown on both and the two lines must look the same on a
terminal: each cell's character, colours and attributes.
"""

from __future__ import annotations

from textual.app import App, ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message_pump import MessagePump
from textual.strip import Strip
from textual.widgets import Label, ProgressBar

from tpudash.runs.model import ProgressState
from tpudash.tui.progressline import ProgressLine


class TextualRow(Horizontal):
    """The run view's progress row as it was, out of Textual's widgets."""

    DEFAULT_CSS = """
    TextualRow { height: 1; }
    TextualRow .progress-unit { width: 10; color: $text-muted; }
    TextualRow ProgressBar { width: auto; }
    TextualRow .progress-eta { width: 1fr; padding: 0 0 0 1; color: $text-muted; }
    """

    def __init__(self, unit: str):
        super().__init__()
        self.unit = unit

    def compose(self) -> ComposeResult:
        yield Label(self.unit, classes="progress-unit")
        yield ProgressBar(show_eta=False)
        yield Label("", classes="progress-eta")

    def show(self, state: ProgressState, note: str) -> None:
        self.query_one(ProgressBar).update(total=state.total, progress=state.done)
        self.query_one(".progress-eta", Label).update(note)


class RowsApp(App):
    CSS = "#column { padding: 0 1; height: auto; }"

    def __init__(self, unit: str = "epoch"):
        super().__init__()
        self.unit = unit

    def compose(self) -> ComposeResult:
        with Vertical(id="column"):
            yield TextualRow(self.unit)
            yield ProgressLine(self.unit)


def seen(strip: Strip) -> list[tuple]:
    """What a terminal shows of a line: each cell's character, colours and attributes."""
    return [
        (
            character,
            style.color,
            style.bgcolor,
            *(bool(getattr(style, name)) for name in ("bold", "dim", "italic", "underline", "reverse", "strike")),
        )
        for segment in strip
        for style in [segment.style]
        if style is not None
        for character in segment.text
    ]


def state(done: int, total: int | None, *, started: float = 0.0, now: float = 10.0) -> ProgressState:
    return ProgressState("epoch", done, total, started, 0, now)


async def shown_lines(app: RowsApp, pilot, progress: ProgressState, finished: bool = False) -> tuple[Strip, Strip]:
    line = app.query_one(ProgressLine)
    line.show(progress, finished)
    app.query_one(TextualRow).show(progress, line.note)
    await pilot.pause()
    await pilot.pause()
    strips = app.screen._compositor.render_strips()
    return strips[0], strips[1]


async def test_a_progress_line_shows_what_textuals_row_shows_at_every_step():
    app = RowsApp()
    async with app.run_test(size=(90, 4)) as pilot:
        for done, total in [(0, 10), (1, 10), (3, 10), (5, 64), (7, 9), (63, 64), (10, 10), (12, 10), (0, 0)]:
            textual, ours = await shown_lines(app, pilot, state(done, total))
            assert ours.text == textual.text, (done, total)
            assert seen(ours) == seen(textual), f"{done}/{total}: {textual.text!r}"
        textual, ours = await shown_lines(app, pilot, state(10, 10), finished=True)
        assert "100% 10/10" in ours.text and "ETA" not in ours.text
        assert seen(ours) == seen(textual)


async def test_a_long_unit_name_and_a_narrow_screen_are_cut_as_textual_cuts_them():
    # Words wrap (the first line shows), a word longer than the column is cut.
    for unit, size, shown in [("examples seen", 50, "examples  "), ("tokens_processed", 60, "tokens_pro")]:
        app = RowsApp(unit=unit)
        async with app.run_test(size=(size, 4)) as pilot:
            textual, ours = await shown_lines(app, pilot, state(1234, 5000, now=2.0))
            assert ours.text[1:11] == shown
            assert seen(ours) == seen(textual), unit


async def test_a_progress_line_follows_the_theme():
    app = RowsApp()
    async with app.run_test(size=(90, 4)) as pilot:
        await shown_lines(app, pilot, state(3, 10))
        app.theme = "textual-light"
        textual, ours = await shown_lines(app, pilot, state(4, 10))
        assert seen(ours) == seen(textual)


async def test_an_unknown_total_moves_its_bar_with_the_count_and_keeps_no_timer(monkeypatch):
    intervals: list[tuple[str, float]] = []
    set_interval = MessagePump.set_interval

    def recorded(self, interval, *args, **kwargs):
        intervals.append((type(self).__name__, interval))
        return set_interval(self, interval, *args, **kwargs)

    monkeypatch.setattr(MessagePump, "set_interval", recorded)
    app = RowsApp()
    async with app.run_test(size=(90, 4)) as pilot:
        line = app.query_one(ProgressLine)
        _, first = await shown_lines(app, pilot, state(5, None))
        assert "--% 5" in first.text and "ETA" not in first.text
        _, again = await shown_lines(app, pilot, state(5, None))
        _, moved = await shown_lines(app, pilot, state(6, None))
        assert again.text == first.text  # a count that stands still: a bar that stands still
        assert moved.text != first.text
        bar = [segment for segment in moved if segment.text.strip("━╸╺") == "" and segment.text]
        lit = {segment.style.color for segment in bar}
        assert line.get_component_rich_style("bar--indeterminate").color in lit
        assert line.auto_refresh is None
        assert not [asked for asked in intervals if asked[0] == "ProgressLine"]
        # Textual's own bar animates an unknown total 15 times a second (what this one leaves out).
        assert app.query_one(TextualRow).query_one("Bar").auto_refresh == 1 / 15


async def test_a_progress_line_repaints_only_when_what_it_shows_changes():
    app = RowsApp()
    async with app.run_test(size=(90, 4)) as pilot:
        line = app.query_one(ProgressLine)
        await shown_lines(app, pilot, state(3, 10))
        refreshes: list[bool] = []
        refresh = line.refresh
        line.refresh = lambda *args, **kwargs: refreshes.append(True) or refresh(*args, **kwargs)  # type: ignore[method-assign]
        line.show(state(3, 10), False)
        assert not refreshes
        line.show(state(4, 10), False)
        assert refreshes
