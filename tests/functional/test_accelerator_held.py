"""Two dashboards on one host: the second watches while the first's engine holds the accelerator.

The first dashboard is another process whose engine holds the host's engine
lock (``tpudash.engine.hostlock``). This dashboard's launch starts an engine
that finds the lock held, names the holder and exits; the run ends unstarted,
the notice and the Devices screen say who holds the accelerator, and no
engine is started again until the next launch. Once the first lets go, the
next launch here gets an engine and runs.
"""

from __future__ import annotations

import subprocess
import sys

from rich.text import Text
from textual.widgets import Static

from screens.devices import DevicesScreen
from tests.functional.conftest import SIZE, run_settled, until
from tests.unit.test_engine_lock import HOLDER_SCRIPT
from tpudash.engine.lane import ENGINE_HELD


async def test_a_second_dashboard_watches_with_a_note_naming_the_holder_and_gets_the_engine_once_it_is_free(
    make_app, job_gate
):
    job_gate.release.set()
    first = subprocess.Popen(
        [sys.executable, "-c", HOLDER_SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert first.stdout is not None and first.stdout.readline().strip() == "held"
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            refused = app.session.launch_by_name("test-steps", {"steps": "4"})
            await run_settled(pilot, refused)
            lane = app.session.lane
            holder = f"tpudash engine pid {first.pid} (dashboard pid 4242, user "
            assert refused.model.status == "failed" and refused.model.started is None
            assert holder in refused.model.error
            notes = [message for _, _, message in app.notices if "This dashboard watches" in message]
            assert len(notes) == 1 and f"The accelerator is held by {holder}" in notes[0]
            assert "press w to watch one" in notes[0]
            assert lane.engine is None and lane.engine_state == ENGINE_HELD
            assert app.engine_status == "held by another dashboard"

            await pilot.press("d")
            assert isinstance(app.screen, DevicesScreen)
            await pilot.pause()
            summary = app.screen.query_one("#runtime-summary", Static).content
            assert isinstance(summary, Text) and holder in summary.plain and "runtime failed" not in summary.plain
            await pilot.press("j")  # leaving and reopening Devices starts no engine: it would be refused again
            await pilot.press("d")
            await pilot.pause()
            assert lane.engine_starts == 1 and lane.engine is None

            first.stdin.close()
            first.wait(30)
            ran = app.session.launch_by_name("test-steps", {"steps": "4"})
            await run_settled(pilot, ran)
            assert ran.model.status == "done" and lane.engine_starts == 2
            await until(pilot, lambda: app.engine_status == "ready on CPU")
    finally:
        if not first.stdin.closed:
            first.stdin.close()
        first.wait(30)
