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


async def test_a_screen_out_of_sight_leaves_its_session_bar_alone_and_shows_the_news_when_visited(make_app):
    # The lane's clock changes the session bar's line every second, and every screen has that bar: screens built
    # ahead redrew theirs unseen, every second, with CPU a training beside the dashboard needs (issue 37).
    from tpudash.tui.bars import SessionBar

    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: all(app.mode_composed(mode) for mode in MODE_SCREENS))
        screens = [stack[0] for stack in app._screen_stacks.values()]
        bars = {type(screen).__name__: screen.query_one(SessionBar) for screen in screens if screen.query(SessionBar)}
        assert len(bars) >= 5
        jobs_bar = bars["JobsScreen"]
        unseen_before = str(jobs_bar.content)
        updates: list[str] = []
        update = SessionBar.update
        for bar in bars.values():
            bar.update = lambda *a, _bar=bar, **k: updates.append(type(_bar.screen).__name__) or update(_bar, *a, **k)  # type: ignore[method-assign]

        app.session._update_lane_status = lambda: None  # type: ignore[method-assign]  # the line is the test's alone
        app.lane_status = "train ● running 0:07"
        await pilot.pause()
        assert "train ● running 0:07" in str(app.screen.query_one(SessionBar).content)
        assert updates == ["DevicesScreen"]  # the screen on show; the others are out of sight
        assert str(jobs_bar.content) == unseen_before

        await pilot.press("j")
        assert type(app.screen).__name__ == "JobsScreen"
        await pilot.pause()
        assert "train ● running 0:07" in str(jobs_bar.content)  # in the frame after, not at the next second
