"""The Log screen's notifications pane keeps up with a long session."""

from __future__ import annotations

from textual.widgets import RichLog

from screens.log import SessionLogScreen
from tests.functional.conftest import SIZE, until


def pane_lines(screen: SessionLogScreen) -> list[str]:
    return [line.text for line in screen.query_one("#notices", RichLog).lines]


async def test_the_notifications_pane_shows_the_newest_notices_past_the_apps_cap_of_500(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("l")
        screen = app.screen
        assert isinstance(screen, SessionLogScreen)
        for number in range(500):
            app.notify(f"notice {number}", timeout=0.01)
        await until(pilot, lambda: any(line.endswith("notice 499") for line in pane_lines(screen)))
        # The app keeps the newest 500 only: from here its list no longer grows.
        for number in range(500, 600):
            app.notify(f"notice {number}", timeout=0.01)
        await until(pilot, lambda: any(line.endswith("notice 599") for line in pane_lines(screen)))
        lines = pane_lines(screen)
        assert lines[-1].endswith("notice 599") and sum(line.endswith("notice 550") for line in lines) == 1
