"""A log pane that wraps at its own width, and wraps what it holds again when that width changes.

Textual's ``RichLog`` wraps each line once, when it is written, at the width it has then, and never
below its ``min_width`` (78). A line written while its tab is hidden (the run view's Log tab, behind
Plots) has no width to go by and was wrapped at 78 columns in a 130-column pane (issue 26, 5.19).
``PaneLog`` keeps the lines it was given (as many as it shows) and wraps them at the pane's width:
on write when the pane has one, and all again when the pane appears or is resized: the newest at
once (what the pane shows), the older ones a chunk per idle moment (5,000 lines take ~0.8 s to wrap,
which no key may wait for), swapped in above them when all are done.
"""

from __future__ import annotations

from collections import deque

from rich.segment import Segment
from rich.text import Text
from textual.events import Resize
from textual.geometry import Size
from textual.strip import Strip
from textual.widgets import RichLog

# Lines wrapped again at once on a resize (about 6 ms per fifty two-row lines), then per idle moment.
REWRAP_CHUNK = 50


class PaneLog(RichLog):
    """A RichLog of ``Text`` lines wrapped at the pane's width, whatever it was when they were written."""

    def __init__(self, *, max_lines: int, id: str | None = None, classes: str | None = None):
        super().__init__(id=id, classes=classes, max_lines=max_lines, wrap=True, markup=False, highlight=False)
        self._entries: deque[Text] = deque(maxlen=max_lines)
        self._wrapped_at = 0
        """The width the lines on show were wrapped at; 0 while the pane has none (hidden, not laid out)."""
        self._rewraps = 0
        """Counts re-wraps: older lines wrapped for an earlier width are dropped, not swapped in."""

    @property
    def wrap_width(self) -> int:
        """Cells a line may take: the pane's, less the vertical scrollbar a long log soon has
        (wrapping again when it appears would move every line)."""
        return max(self.content_region.width - self.styles.scrollbar_size_vertical, 0)

    def write_line(self, text: Text) -> None:
        """Add one line (wrapped at the pane's width as soon as the pane has one)."""
        self._entries.append(text)
        if self._wrapped_at:
            self.write(text, width=self._wrapped_at)

    def clear(self) -> PaneLog:
        self._entries.clear()
        self._rewraps += 1
        return super().clear()

    def on_resize(self, _event: Resize) -> None:
        width = self.wrap_width
        if width <= 0 or width == self._wrapped_at:
            return  # hidden: keep the lines as they are until the pane shows again
        self._wrapped_at = width
        self._rewraps += 1
        entries = list(self._entries)
        super().clear()
        for text in entries[-REWRAP_CHUNK:]:
            self.write(text, width=width)
        older = entries[:-REWRAP_CHUNK]
        if older:
            self.call_later(self._wrap_older, older, [], 0, width, self._rewraps)

    def _wrap_older(self, older: list[Text], done: list[Strip], widest: int, width: int, rewrap: int) -> None:
        """Wrap the next chunk of ``older``; when none is left, put them all above the lines on show."""
        if rewrap != self._rewraps:
            return  # cleared, or resized again: that re-wrap has its own
        chunk, rest = older[:REWRAP_CHUNK], older[REWRAP_CHUNK:]
        for text in chunk:
            strips = self._wrapped(text, width)
            done.extend(strips)
            widest = max(widest, *(strip.cell_length for strip in strips))
        if rest:
            self.call_later(self._wrap_older, rest, done, widest, width, rewrap)
            return
        at_end = self.is_vertical_scroll_end
        lines = done + self.lines
        if self.max_lines is not None and len(lines) > self.max_lines:
            lines = lines[-self.max_lines :]
        added = len(lines) - len(self.lines)
        self.lines = lines
        self._line_cache.clear()
        self._widest_line_width = max(self._widest_line_width, widest)
        self.virtual_size = Size(self._widest_line_width, len(self.lines))
        if at_end:
            self.scroll_end(animate=False, immediate=False, x_axis=False)
        else:
            self.scroll_to(y=self.scroll_y + added, animate=False, immediate=True)
        self.refresh()

    def _wrapped(self, text: Text, width: int) -> list[Strip]:
        """``text`` as RichLog.write renders it at ``width``: its wrapped rows."""
        console = self.app.console
        segments = console.render(text, console.options.update_width(width))
        return Strip.from_lines(list(Segment.split_lines(segments))) or [Strip.blank(width)]
