"""The keys line lists every key that works where it is, and greys the ones that would do nothing
(issue 38, item 15: ``w``, ``l`` and ``E`` were never listed, ``v run`` left the line at 80 columns,
and "x cancel this run" stayed on finished runs)."""

from __future__ import annotations

import pytest

from tests.functional.conftest import run_settled, runtime_ready, until
from tpudash.tui.bars import KeyBar

# Keys of the whole app that work on every screen: a bare key at 80 columns, "w watch" when there is room.
EVERY_SCREEN = ("d", "j", "h", "v", "n", "l", "w", "E", "question_mark", "q", "ctrl+p")
SCREENS = (("d", "devices"), ("j", "jobs"), ("v", "run"), ("h", "history"), ("n", "hosts"), ("l", "log"))


def keys_on_the_line(app) -> dict[str, str]:
    """Each key on the keys line as drawn: key → the cells it takes (what a user reads)."""
    keys_line = app.screen.query_one(KeyBar)
    line = str(keys_line.render())
    return {key: line[start:end] for start, end, key in keys_line.spans}


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
async def test_every_screen_lists_the_apps_keys_v_w_l_and_E_included(make_app, size):
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await runtime_ready(pilot)
        for key, mode in SCREENS:
            await pilot.press(key)
            await until(pilot, lambda mode=mode: app.current_mode == mode)
            shown = keys_on_the_line(app)
            missing = [key for key in EVERY_SCREEN if key not in shown]
            assert not missing, (mode, missing, str(app.screen.query_one(KeyBar).render()))
            assert shown["v"].strip().startswith("v") and shown["E"].strip().startswith("E"), (mode, shown)
        if size[0] >= 160:  # room for the words too
            assert {shown[key].strip() for key in ("v", "w", "l")} == {"v run", "watch", "log"}, shown


def cancel_key_style(app):
    """The style the keys line draws ``x`` in (None: not on the line)."""
    keys_line = app.screen.query_one(KeyBar)
    line = keys_line.render()
    for start, _end, key in keys_line.spans:
        if key == "x":
            return line.get_style_at_offset(app.console, start)
    return None


async def test_x_is_greyed_once_the_run_shown_has_ended(make_app, job_gate):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await runtime_ready(pilot)
        live = app.session.launch_by_name("test-steps")
        await until(pilot, lambda: job_gate.reached.is_set() and app.current_mode == "run")
        await until(pilot, lambda: cancel_key_style(app) is not None)
        assert not cancel_key_style(app).dim, "x is greyed while the run it cancels is running"
        assert app.screen.active_bindings["x"].enabled
        job_gate.release.set()
        await run_settled(pilot, live)
        assert live.model.status == "done"
        await until(pilot, lambda: not app.screen.active_bindings["x"].enabled)
        await pilot.pause()
        assert cancel_key_style(app).dim, "x is drawn as if it could still cancel a finished run"
        # And a press does nothing to the finished run.
        await pilot.press("x")
        await pilot.pause()
        assert live.model.status == "done"
