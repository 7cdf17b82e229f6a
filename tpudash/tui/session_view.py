"""What the session needs of the screen it shows through: ``SessionView``, the app's reactives, notices and UI thread.

``tpudash.tui.view.DashboardView`` (the Textual app) is one; the session's
tests use a plain object. Textual-free, as the session
(``tpudash.tui.session.DashboardSession``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    import asyncio

Severity = Literal["information", "warning", "error"]


class SessionView(Protocol):
    """Where the session shows what it knows: the app's reactives, its notifications, its UI thread."""

    runtime_status: str
    engine_status: str
    lane_status: str
    runtime: Any
    runtime_error: str | None
    framework_missing: str | None
    device_check: dict | None
    shown_run_id: str | None
    lane_version: int
    runs_version: int
    telemetry: Any
    runtime_settled: asyncio.Event
    host_check: dict | None

    def notify(
        self, message: str, *, title: str = "", severity: Severity = "information", timeout: float | None = None
    ) -> None: ...

    def call_later(self, callback: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
        """Run ``callback`` on the UI thread soon (callable from any thread); False once the UI has closed."""
        ...

    def redraw_now(self) -> None:
        """A run was queued, started or ended: the screen on show redraws now rather than at the next tick."""
        ...

    def show_run_view(self) -> None:
        """Switch to the Run view, which draws ``shown_run_id`` (after a launch)."""
        ...

    def ask(self, question: str, *, yes: str, no: str, answered: Callable[[bool], None]) -> None:
        """A modal question, ``yes`` the default; ``answered`` gets the choice on the UI thread."""
        ...
