"""Issue 26: a screen's first visit is as quick as a re-visit, because the app builds every screen in idle time.

Textual builds a mode's screen on its first switch and then re-parses the
whole stylesheet (0.1–0.5 s measured in tmux). tpudash builds them after the
first frame (``TpudashApp.compose_screens_ahead``): a key's first press only
switches, with no stylesheet parse, and draws the screen it names.
"""

from __future__ import annotations

from tests.functional.conftest import until
from tpudash.tui.modes import MODE_SCREENS

KEYS = {
    "j": "JobsScreen",
    "h": "HistoryScreen",
    "v": "RunScreen",
    "l": "SessionLogScreen",
    "question_mark": "HelpScreen",
}


async def test_every_screen_is_built_before_its_first_key(make_app):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: all(app.mode_composed(mode) for mode in MODE_SCREENS))
        parses = []
        parse = app.stylesheet.reparse
        app.stylesheet.reparse = lambda: parses.append(app.current_mode) or parse()
        for key, screen_name in [*KEYS.items(), ("d", "DevicesScreen")]:
            await pilot.press(key)
            assert type(app.screen).__name__ == screen_name
            assert parses == [], f"{key}: the first visit re-parsed the stylesheet"


async def test_a_key_pressed_before_the_screens_are_built_shows_its_screen(make_app):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        # At once after the first frame, before the idle-time build reaches History.
        await pilot.press("h")
        assert type(app.screen).__name__ == "HistoryScreen"
        await pilot.press("j")
        assert type(app.screen).__name__ == "JobsScreen"
        await until(pilot, lambda: all(app.mode_composed(mode) for mode in MODE_SCREENS))
        await pilot.press("h")
        assert type(app.screen).__name__ == "HistoryScreen"
