"""The frame every tpudash screen shares: the session bar on top, the keys below.

A screen subclasses ``DashScreen`` and yields its body from ``compose_body``;
the shell's bars (``tpudash.tui.bars``) come with it, and ``dashboard`` is the
app with its type. This module stays light (no plots, no jobs): the first
screen imports it before the first frame.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen

from tpudash.tui.bars import KeyBar, SessionBar
from tpudash.tui.seams import KeptLayout, PaintsWhatChanged

if TYPE_CHECKING:
    from tpudash.tui.app import TpudashApp


class DashScreen(PaintsWhatChanged, KeptLayout, Screen):
    """A screen with the session bar and the keys line around its body; shown again, it keeps its layout."""

    BINDINGS = [
        # Textual's own tab moves the focus only once the key has passed
        # through every widget above the focused one, after the keys typed
        # behind it were already handed to the old field ("512<tab>256" in
        # one write typed 512256). A priority binding moves it as the key
        # arrives, so the following keys reach the next field.
        Binding("tab", "app.focus_next", "Next field", id="tpudash.focus_next", show=False, priority=True),
        Binding(
            "shift+tab", "app.focus_previous", "Previous field", id="tpudash.focus_previous", show=False, priority=True
        ),
    ]

    @property
    def dashboard(self) -> TpudashApp:
        """The app this screen runs in, with its type: its reactives, its session and its settings."""
        return cast("TpudashApp", self.app)

    def compose(self) -> ComposeResult:
        yield SessionBar()
        yield from self.compose_body()
        yield KeyBar()

    def on_screen_resume(self, event: events.ScreenResume) -> None:
        # A mode switch asks the screen to re-apply the whole stylesheet to
        # every widget (~20 ms for the Jobs form), though nothing about its
        # styles changed while it was hidden: a theme change re-applies CSS
        # on its own, and widgets restyle themselves when their classes
        # change. Textual skips the same work when a screen on top is
        # popped; a screen that has been shown before skips it here. (A
        # subclass's handler runs before Screen's own, which reads the flag.)
        if self._shown_before or self.composed_ahead:
            event.refresh_styles = False
        self._shown_before = True

    _shown_before = False
    composed_ahead = False
    """Set when the app built this screen before its first visit (tpudash.tui.seams): its styles are current."""

    def compose_body(self) -> ComposeResult:
        raise NotImplementedError
