"""The Log tab wraps at its pane's width (issue 26, 5.19).

Tracebacks wrapped at about 80 characters in a 130-column pane: lines written while the Log tab was hidden
were wrapped at RichLog's 78-column minimum. Here a run logs a 120-character line while its Plots tab is
on show; in a 160-column app the Log tab then shows it on one line, and after a resize to 80 columns on
lines that fit the pane.
"""

from __future__ import annotations

from jobs.base import JobSpec
from jobs.events import Metric
from tests.functional.conftest import run_settled, runtime_ready, until
from tests.functional.test_app_80x24 import screen_rows

LONG_LINE = '  File "/usr/lib/python3.11/site-packages/keras/src/utils/traceback_utils.py", line 122, in error_handler: raise e.with_'


def _long_log_job() -> JobSpec:
    def run(ctx, params):
        ctx.emit(Metric("loss", 1.0, 1))
        ctx.emit(Metric("loss", 0.5, 2))
        ctx.log(LONG_LINE)
        return {}

    return JobSpec(name="test-long-log", title="Test long log", description="Logs a long line.", params=(), run=run)


def log_rows(app) -> list[str]:
    log = app.screen.view.query_one("#run-log").region
    return [row[log.x : log.right].rstrip() for row in screen_rows(app)[log.y : log.bottom]]


async def test_a_120_character_line_shows_on_one_line_in_a_160_column_app(make_app, test_specs):
    assert len(LONG_LINE) == 120
    app = make_app(job_specs={**test_specs, "test-long-log": _long_log_job()})
    async with app.run_test(size=(160, 48)) as pilot:
        await runtime_ready(pilot)
        live = app.session.launch_by_name("test-long-log")
        await run_settled(pilot, live)
        await until(pilot, lambda: app.current_mode == "run" and app.screen.view.model is live.model)
        tabs = app.screen.view.query_one("#run-tabs")
        assert tabs.active == "tab-plots"  # the line was written while the Log tab was hidden
        await pilot.click("#run-tabs Tab#--content-tab-tab-log")
        await until(pilot, lambda: tabs.active == "tab-log")
        rows = log_rows(app)
        assert any(LONG_LINE in row for row in rows), "\n".join(rows)

        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        rows = [row for row in log_rows(app) if row.strip()]
        width = app.screen.view.query_one("#run-log").region.width
        assert " ".join(" ".join(rows).split()).endswith(" ".join(LONG_LINE.split())), "\n".join(rows)
        assert all(len(row) <= width for row in rows)
