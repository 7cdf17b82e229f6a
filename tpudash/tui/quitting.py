"""How the dashboard quits: q and the stop signals, asking first while a job runs, the cancel recorded before exit.

``QuitFlow`` is an App mixin (``TpudashApp`` places it before ``App``). The
session decides what to ask (``DashboardSession.quit_question``: nothing
when no job runs or waits); a yes (or a first SIGTERM/SIGINT, which
``tpudash.tui.hostio`` hands to ``quit_on_signal``) cancels every run, waits
until the lane has recorded the cancel, releases the engine and exits. A
second signal, or q while quitting, leaves at once: the engine records its
job on its own after the dashboard has gone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual import work
from textual.worker import Worker

if TYPE_CHECKING:
    from tpudash.tui.session import DashboardSession
    from tpudash.tui.ticks import UITicks

    _MixedIntoApp = UITicks
else:
    _MixedIntoApp = object


class QuitFlow(_MixedIntoApp):
    """q, the stop signals, and the worker that cancels every run, waits for the record, and exits."""

    session: DashboardSession

    def __init__(self) -> None:
        super().__init__()
        self.quit_worker: Worker | None = None
        """The worker that cancels every run and exits, once quit was confirmed."""

    def quit_on_signal(self, signum: int) -> None:
        """SIGTERM or SIGINT: a first one quits as a confirmed q does, a second leaves at once."""
        if self.session.quitting:
            self.force_exit(130)
            return
        self.quit_worker = self.cancel_and_exit(130)

    def force_exit(self, return_code: int) -> None:
        """Leave without waiting for the cancel to be recorded (second signal, or q while quitting).

        The engine is released as the app unmounts: it cancels and records
        its job on its own, after the dashboard has gone.
        """
        self.exit(return_code, return_code=return_code)

    async def action_quit(self) -> None:
        """Quit; while a job runs or waits, ask first (yes cancels, records, exits)."""
        from tpudash.tui.dialogs import ConfirmScreen

        if self.session.quitting:
            self.force_exit(130)
            return
        question = self.session.quit_question()
        if question is None:
            self.exit(0)
            return
        if isinstance(self.screen, ConfirmScreen):
            return  # already asking (ctrl+q reaches here past the dialog)
        self.push_screen(ConfirmScreen(question, yes="Cancel and quit", no="Keep running"), self._quit_answered)

    def _quit_answered(self, yes: bool | None) -> None:
        if yes:
            self.quit_worker = self.cancel_and_exit(0)

    @work(exclusive=True, group="quit", exit_on_error=False, description="Cancel every run, wait until recorded, exit")
    async def cancel_and_exit(self, return_code: int = 0) -> None:
        """Cancel, wait for the record (the lane ends the engine after the grace period), exit."""
        self.session.begin_quit()
        while not self.session.stopped:
            current = self.session.lane.current
            # The run's end, the moment the lane reads it (an engine message wakes the lane), not a tick later.
            await (current.settled.wait() if current is not None else self.next_tick())
        # Released now, the engine leaves while Textual closes every screen (~0.2 s), not after.
        self.session.close()
        self.exit(return_code, return_code=return_code)
