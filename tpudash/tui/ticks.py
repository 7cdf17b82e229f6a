"""The UI timer: every ``TICK_SECONDS`` the session reads its lane and the screen on show redraws what changed.

``UITicks`` is an App mixin (``TpudashApp`` places it before ``App``). Each
tick calls the session's ``tick()`` (the lane's events, the status lines),
then posts a ``DisplayTick`` to the screen on show; ``next_tick()`` returns
once that screen has handled it, which is how tests and benchmarks wait for
the dashboard to have drawn, never with a clock. ``redraw_now()`` is the
session's way to have the screen redraw between ticks (a run queued,
started or ended). Once ``exit()`` is called, ticks stop drawing on closing
widgets and nothing waits for a tick that will not come.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from textual.app import ScreenStackError

from tpudash.tui import collector
from tpudash.tui.messages import DisplayTick

if TYPE_CHECKING:
    from textual.screen import Screen

    from tpudash.tui.session import DashboardSession
    from tpudash.tui.view import DashboardView

    _MixedIntoApp = DashboardView
else:
    _MixedIntoApp = object

# Five reads a second: a run's news shows within 0.2 s (what is drawn moves on the one-second display beat
# anyway), and each tick's reading and messaging is CPU a training beside the dashboard needs (issue 37).
TICK_SECONDS = 0.2


class UITicks(_MixedIntoApp):
    """The app's timer: the session ticks, the screen on show redraws; ``next_tick()`` waits for one."""

    session: DashboardSession

    def __init__(self) -> None:
        super().__init__()
        self.exiting = False
        """True once exit() was called: timers stop drawing on closing widgets."""
        self._tick_event = asyncio.Event()
        self._last_tick = asyncio.Event()

    def start_ticking(self) -> None:
        """Tick every ``TICK_SECONDS`` from now on (the app's ``on_mount``)."""
        self.set_interval(TICK_SECONDS, self._tick, name="tpudash tick")

    def _tick(self) -> None:
        collector.let_go(held_for=collector.HOLD_SECONDS_AT_MOST)  # a key's hold whose frame never came
        self.session.tick()
        screen = self._sync_active_screen()
        ticked, self._tick_event = self._tick_event, asyncio.Event()
        # A screen that was closing when it was handed the last tick never runs its callback: whoever waits on
        # that tick wakes with this one instead of never.
        self._last_tick.set()
        self._last_tick = ticked
        # Queued behind the tick, so next_tick() returns once the screen has redrawn.
        if screen is None or not screen.call_later(ticked.set):
            ticked.set()

    async def next_tick(self) -> None:
        """Wait until the UI's timer has read new events and redrawn once more (tests, benchmarks)."""
        if self.exiting:
            return  # the timer stops as the app closes: no tick is coming
        await self._tick_event.wait()

    def redraw_now(self) -> None:
        self._sync_active_screen(force=True)

    def _sync_active_screen(self, force: bool = False) -> Screen | None:
        """Tell the screen on show to redraw what changed; the screen told, if any."""
        if self.exiting or not self.is_running:
            return None  # widgets are being closed (exit, or a test's shutdown); nothing to draw on
        try:
            screen = self.screen
        except ScreenStackError:
            return None
        screen.post_message(DisplayTick(force))
        return screen

    def exit(self, *args: Any, **kwargs: Any) -> None:
        self.exiting = True
        self._tick_event.set()  # nothing waits for a tick that will not come
        self._last_tick.set()
        super().exit(*args, **kwargs)
