"""Textual's widgets without the work they do while what they draw does not move, cannot be seen, or keeps its size.

Each timer wakes the UI thread whether or not its widget is on show, and
every wake-up or layout is CPU taken from the training the dashboard watches:

- ``Spinner``: Textual's ``LoadingIndicator`` redraws 16 times a second from
  mount to removal, hidden or not. The Devices screen's (shown while the
  runtime connects) kept doing so for the whole session, behind every other
  screen, after the runtime had long answered: 16 wake-ups a second of the
  UI thread for nothing. This one animates only while it is displayed on the
  screen on show.
- ``SteadyStatic``: Textual's ``Static.update`` lays the whole screen out
  (and so repaints every widget on it, 12-20 ms of the UI thread on a run
  view) for each new text. A line that moves each second (a stage's clock)
  did so every second. This one lays out only when the new text changes
  its height.
- ``OneLineStatic``: a Static of one line turns its text into that line
  through Textual's whole text layout (visual, content, wrapping, one style
  lookup per span) at each repaint: about half a millisecond, more while
  training takes the caches, for the session bar's and the run title's
  clocks every second. This one draws a Rich ``Text`` straight to its line,
  the same cells and text-selection offsets as Textual's.
"""

from __future__ import annotations

from typing import cast

from rich.segment import Segment
from rich.style import Style as RichStyle
from rich.text import Text
from textual.css.styles import RulesMap
from textual.screen import Screen
from textual.strip import Strip
from textual.visual import VisualType, visualize
from textual.widgets import LoadingIndicator, Static

SPINNER_FRAME_SECONDS = 1 / 16
"""How often the spinner redraws while it is seen (Textual's own rate)."""


class Spinner(LoadingIndicator):
    """A loading indicator that animates while it is displayed on the current screen, and keeps no timer otherwise."""

    def on_mount(self) -> None:
        self.app.screen_change_signal.subscribe(self, self._screen_changed)
        # Queued behind the mount handlers: LoadingIndicator's own starts the timer after this one runs.
        self.call_later(self._animate_if_seen)

    def on_show(self) -> None:
        self._animate_if_seen()

    def on_hide(self) -> None:
        self._animate_if_seen()

    def _screen_changed(self, _screen: Screen) -> None:
        self._animate_if_seen()

    @property
    def animating(self) -> bool:
        """Whether its timer runs."""
        return self.auto_refresh is not None

    def _animate_if_seen(self) -> None:
        if not self.is_attached:
            return
        seen = self.display and self.screen.is_current and self.is_on_screen
        wanted = SPINNER_FRAME_SECONDS if seen else None
        if self.auto_refresh != wanted:
            self.auto_refresh = wanted


class SteadyStatic(Static):
    """A Static whose new text lays the screen out only when it changes the Static's height.

    A text of the same height is repainted in place. Only for a Static whose width is not its text's
    (a ``height: auto`` line that wraps in its container): there, only the height can move the widgets around it.
    """

    def update(self, content: VisualType = "", *, layout: bool = True) -> None:
        super().update(content, layout=layout and not self._keeps_height(content))

    def _keeps_height(self, content: VisualType) -> bool:
        width = self.size.width
        if not width or not self.display:  # not laid out yet, or hidden: the next layout measures it anyway
            return False
        if self.styles.width is not None and self.styles.width.is_auto:
            return False  # as wide as its text: a new text may change its width
        new = visualize(self, content, markup=self._render_markup)
        rules = cast("RulesMap", self.styles)  # what Textual's own get_content_height measures with
        return new.get_height(rules, width) == self.visual.get_height(rules, width)


OVERFLOWS_DRAWN = {("wrap", "fold"), ("nowrap", "ellipsis")}
"""The (text-wrap, text-overflow) a ``OneLineStatic`` draws itself; any other is left to Static."""


class OneLineStatic(Static):
    """A one-line Static that draws a Rich ``Text`` straight to its line; any other content as Static does.

    What shows is what Static shows (``tests/unit/test_quiet_widgets.py`` holds the cells to it): the text's
    styles over the widget's, the first line of the text as Textual wraps it when it is too wide (or cut with an
    ellipsis, for ``text-wrap: nowrap; text-overflow: ellipsis``), blanks after. A line styled otherwise than
    left-aligned, or a text with a style of its own (not only its spans'), is left to Static.
    """

    DEFAULT_CSS = "OneLineStatic { height: 1; }"

    def render_line(self, y: int) -> Strip:
        text = self.content
        styles = self.styles
        overflow = (styles.text_wrap, styles.text_overflow)
        left = (styles.text_align, styles.content_align_horizontal) == ("start", "left")
        if y or not isinstance(text, Text) or text.style or not left or overflow not in OVERFLOWS_DRAWN:
            return super().render_line(y)  # a style on the whole text Textual blends into its colours
        width = self.content_size.width
        console = self.app.console
        if text.cell_len > width and overflow == ("nowrap", "ellipsis"):
            text = text.copy()
            text.truncate(width, overflow="ellipsis")
        elif text.cell_len > width:
            text = text.wrap(console, width)[0]  # the line Textual shows: words that fit, a long word folded
            text.rstrip()
        look = self.visual_style.rich_style
        segments = [
            Segment(segment.text, look + segment.style if segment.style else look)
            for segment in text.render(console)
            if segment.text and segment.text != "\n"
        ]
        # Offsets as Textual gives its text (mouse selection reads them), none on the blanks after.
        return Strip(segments).apply_offsets(0, y).adjust_cell_length(width, RichStyle(bgcolor=look.bgcolor))
