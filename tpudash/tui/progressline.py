"""One unit's progress as one widget drawing one line: its name, a bar, the percentage, the counts and the ETA.

The run view shows a row per unit (epoch, step) while a run trains. Drawn with
Textual's own widgets, a row was six (a container, a label, a ``ProgressBar``
holding a ``Bar`` and a percentage label, and a label for the counts): each
beat repainted four of them and the compositor cut them apart again, the run
body's largest repaint after its plots (2.4 ms a frame, issue 37). This widget
draws the same cells in one line (``tests/unit/test_progress_line.py`` holds
it to Textual's own row), and repaints only when what it shows changed.

An unknown total shows Textual's indeterminate bar. Textual animates that one
15 times a second for as long as it is on screen; here its highlight moves only
when the count does, so a run that stalls shows a bar that stands still.
"""

from __future__ import annotations

import textwrap

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style as RichStyle
from rich.text import Text
from textual.renderables.bar import Bar as BarRenderable
from textual.strip import Strip
from textual.widget import Widget

from tpudash.format import format_seconds
from tpudash.runs.model import ProgressState

UNIT_WIDTH = 10
BAR_WIDTH = 32
"""Textual's ``Bar`` default width."""
PERCENT_WIDTH = 5
INDETERMINATE_CELLS_PER_STEP = 2
"""How far an unknown total's highlight moves for each unit done."""


class ProgressLine(Widget, can_focus=False):
    """One unit's progress: name, bar, percentage, counts and ETA, drawn as one strip."""

    COMPONENT_CLASSES = {"progress-line--muted", "bar--bar", "bar--complete", "bar--indeterminate"}
    # The same looks as Textual's ProgressBar and the labels of the row it replaces.
    DEFAULT_CSS = """
    ProgressLine {
        height: 1;
        &> .progress-line--muted { color: $text-muted; }
        &> .bar--bar { color: $primary; background: $surface; }
        &> .bar--indeterminate { color: $error; background: $surface; }
        &> .bar--complete { color: $success; background: $surface; }
    }
    """

    def __init__(self, unit: str, *, id: str | None = None, classes: str | None = None):
        super().__init__(id=id, classes=classes)
        self.unit = unit
        self.done = 0
        self.total: int | None = None
        self.note = ""
        """The counts and ETA written after the bar."""
        self._strip: tuple[tuple[object, ...], Strip] | None = None
        self._bars: dict[tuple[object, ...], list[Segment]] = {}
        """Bars drawn, by highlight, style and look: a bar moves in half cells, so it is mostly one drawn before."""
        self._looks: tuple[tuple[RichStyle, str], dict[str, RichStyle]] | None = None

    @property
    def percentage(self) -> float | None:
        """Done over total, between 0 and 1; None while the total is unknown."""
        if self.total is None:
            return None
        return 1.0 if self.total <= 0 else min(max(self.done / self.total, 0.0), 1.0)

    def show(self, state: ProgressState, finished: bool) -> None:
        """Show ``state``; repaint only if that changes a cell."""
        counts = f"{state.done}/{state.total}" if state.total is not None else str(state.done)
        eta = "" if finished or state.total is None else f"  ETA {format_seconds(state.eta(), precise=False)}"
        shown = (state.done, state.total, counts + eta)
        if shown != (self.done, self.total, self.note):
            self.done, self.total, self.note = shown
            self.refresh()

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        look = self.visual_style.rich_style
        key = (width, look, self.done, self.total, self.note, self.app.theme)
        if self._strip is None or self._strip[0] != key:
            self._strip = (key, self._draw(width, look))
        return self._strip[1]

    def _component(self, name: str, look: RichStyle) -> RichStyle:
        """A component class's style, found once per look (Textual works it out anew at every call)."""
        key = (look, self.app.theme)
        if self._looks is None or self._looks[0] != key:
            self._looks = (key, {})
            self._bars.clear()
        styles = self._looks[1]
        if name not in styles:
            styles[name] = self.get_component_rich_style(name)
        return styles[name]

    def _draw(self, width: int, look: RichStyle) -> Strip:
        muted = self._component("progress-line--muted", look)
        blank = RichStyle(bgcolor=look.bgcolor)  # what Textual pads a label with
        percentage = self.percentage
        percent = "--%" if percentage is None else f"{round(percentage * 100)}%"
        segments = [
            *_cell_text(first_line(self.unit, UNIT_WIDTH), UNIT_WIDTH, muted, blank),
            *self._bar(percentage, look),
            *_cell_text(percent.rjust(PERCENT_WIDTH), PERCENT_WIDTH, look, blank),
            Segment(" ", blank),
            Segment(first_line(self.note, width - UNIT_WIDTH - BAR_WIDTH - PERCENT_WIDTH - 1), muted),
        ]
        return Strip(segments).adjust_cell_length(width, blank)

    def _bar(self, percentage: float | None, look: RichStyle) -> list[Segment]:
        """Textual's Bar at its default width: its renderable, its half-cell steps, its component styles."""
        if percentage is None:
            name = "bar--indeterminate"
            highlighted = 0.25 * BAR_WIDTH
            span = BAR_WIDTH + highlighted  # as Textual's: the highlight goes into the corners
            start = (self.done * INDETERMINATE_CELLS_PER_STEP) % (2 * span)
            start = (2 * span - start if start > span else start) - highlighted
            highlight = (max(0.0, start), min(start + highlighted, BAR_WIDTH))
        else:
            name = "bar--bar" if percentage < 1 else "bar--complete"
            quantized = int(percentage * BAR_WIDTH * 2) / (BAR_WIDTH * 2)  # Bar's own half-cell steps
            highlight = (0.0, BAR_WIDTH * quantized)
        drawn = self._bars.get((highlight, name))
        if drawn is None:
            drawn = self._bars[highlight, name] = self._draw_bar(highlight, self._component(name, look), look)
        return drawn

    def _draw_bar(self, highlight: tuple[float, float], style: RichStyle, look: RichStyle) -> list[Segment]:
        bar = BarRenderable(
            highlight_range=highlight,
            highlight_style=RichStyle.from_color(style.color),
            background_style=RichStyle.from_color(style.bgcolor),
            width=BAR_WIDTH,
        )
        console = self.app.console
        texts = [text for text in bar.__rich_console__(console, console.options.update_width(BAR_WIDTH))]
        return [
            Segment(segment.text, look + segment.style if segment.style else look)
            for text in texts
            if isinstance(text, Text)
            for segment in text.render(console)
            if segment.text
        ]


def _cell_text(text: str, width: int, style: RichStyle, blank: RichStyle) -> list[Segment]:
    """``text`` in exactly ``width`` cells: cut, or padded with ``blank`` cells."""
    return list(Strip([Segment(text, style)]).adjust_cell_length(width, blank))


def first_line(text: str, width: int) -> str:
    """What a label ``width`` cells wide and one line high shows of ``text``: the first line as it wraps, whole
    words unless a word alone is wider."""
    if cell_len(text) <= width:
        return text
    return (textwrap.wrap(text, max(width, 1)) or [""])[0]
