"""Messages the shell sends its screens.

A screen's module imports this to handle them; the shell never imports a screen.
"""

from __future__ import annotations

from textual.message import Message


class DisplayTick(Message, bubble=False):
    """To the screen on show, on the app's timer (10 Hz) and, with ``force``, when a run
    starts or ends: read what the runs added and redraw what changed. A screen
    that shows nothing live ignores it."""

    def __init__(self, force: bool = False) -> None:
        super().__init__()
        self.force = force

    def can_replace(self, message: Message) -> bool:
        # Ticks that queued up while the screen was busy are one redraw, not
        # several; only a forced one is never folded into a plain one.
        return isinstance(message, DisplayTick) and (message.force or not self.force)
