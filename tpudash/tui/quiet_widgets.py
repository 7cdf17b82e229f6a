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
"""

from __future__ import annotations

from typing import cast

from textual.css.styles import RulesMap
from textual.screen import Screen
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
