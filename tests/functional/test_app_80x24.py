"""The dashboard in an 80×24 terminal: every key of the contract on the keys line, a long error
whole, the train form mostly in view, and toasts that cover no plot."""

from __future__ import annotations

import io

from rich.console import Console
from textual.widgets._toast import Toast

from jobs.base import JobSpec
from screens.jobs import JobsScreen
from tests.functional.conftest import run_settled, runtime_ready, shown_live, until
from tpudash.tui.bars import KeyBar, SessionBar
from tpudash.tui.paramform import ParamField
from tpudash.tui.plots import BudgetedPlot

SMALL = (80, 24)
# design.md's "TUI keys": tests outside the project drive them.
CONTRACT_KEYS = {
    "d": "d",
    "j": "j",
    "h": "h",
    "question_mark": "?",
    "q": "q",
    "m": "m",
    "r": "r",
    "g": "g",
    "t": "t",
    "c": "c",
    "ctrl+p": "^p",
}
LONG_ERROR = (
    "the data directory /mnt/datasets/tensorflow_datasets/mnist/3.0.1 holds no prepared copy of mnist and "
    "the download from storage.googleapis.com timed out after 10 s; pass --data-dir with a prepared copy, "
    "or --set source=synthetic for a learnable stand-in of the same shapes, or connect this host to the "
    "network and run again"
)


def screen_rows(app) -> list[str]:
    """The characters on the terminal now, row by row (what a user reads), drawn as App.export_screenshot does."""
    width, height = app.size
    console = Console(
        width=width,
        height=height,
        file=io.StringIO(),
        force_terminal=True,
        color_system="truecolor",
        record=True,
        legacy_windows=False,
        safe_box=False,
    )
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text().splitlines()


def _long_error_job() -> JobSpec:
    def run(ctx, params):
        raise RuntimeError(LONG_ERROR)

    return JobSpec(
        name="test-long-error", title="Test long error", description="Fails with a long message.", params=(), run=run
    )


async def test_every_key_of_the_contract_is_on_the_keys_line_of_every_screen(make_app, job_gate):
    job_gate.release.set()
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        await runtime_ready(pilot)
        await run_settled(pilot, app.session.launch_by_name("test-steps"))
        for key, mode in (
            ("d", "devices"),
            ("j", "jobs"),
            ("v", "run"),
            ("h", "history"),
            ("l", "log"),
            ("question_mark", "help"),
        ):
            await pilot.press(key)
            await until(pilot, lambda mode=mode: app.current_mode == mode)
            keys_line = app.screen.query_one(KeyBar)
            line = str(keys_line.render())
            assert len(line) <= 80
            shown = {bound: line[start:end] for start, end, bound in keys_line.spans}
            for contract_key, display in CONTRACT_KEYS.items():
                assert contract_key in shown, (mode, contract_key, line)
                assert shown[contract_key].strip().startswith(display), (mode, contract_key, line)


async def test_a_long_error_is_whole_in_the_run_view_and_short_in_the_header(make_app, test_specs):
    app = make_app(job_specs={**test_specs, "test-long-error": _long_error_job()})
    async with app.run_test(size=SMALL) as pilot:
        await runtime_ready(pilot)
        live = app.session.launch_by_name("test-long-error")
        await run_settled(pilot, live)
        await until(pilot, lambda: app.current_mode == "run" and app.screen.view.model is live.model)
        assert live.model.status == "failed" and LONG_ERROR in live.model.error
        await pilot.pause()
        # Under the run's title, not only in its log.
        error_line = app.screen.view.query_one("#run-error").region
        assert error_line.area
        rows = screen_rows(app)[error_line.y : error_line.bottom]
        on_screen = " ".join(" ".join(row[error_line.x : error_line.right] for row in rows).split())
        assert " ".join(live.model.error.split()) in on_screen
        header = str(app.screen.query_one(SessionBar).content)
        assert "test-long-error failed" in header and header.endswith("…") and len(header) <= 78


async def test_the_train_form_shows_most_of_its_fields_at_once(make_app):
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        await runtime_ready(pilot)
        await pilot.press("t")
        assert isinstance(app.screen, JobsScreen)
        form = app.screen.current_form
        assert form.spec.name == "train"
        await until(pilot, lambda: all(field.is_mounted for field in form.fields))
        screen = app.screen.region
        in_view = [
            field
            for field in form.query(ParamField)
            if field.region.area and form.region.contains_region(field.region) and screen.contains_region(field.region)
        ]
        assert len(form.fields) == 17  # the workers field included
        assert len(in_view) >= 12, [field.param.name for field in in_view]


async def test_toasts_cover_no_plot_of_the_run_view(make_app):
    app = make_app()
    async with app.run_test(size=SMALL, notifications=True) as pilot:
        await runtime_ready(pilot)
        await pilot.press("g")
        live = shown_live(app)
        await run_settled(pilot, live)
        app.notify(
            "a notification long enough to wrap over several lines of a toast at eighty columns, as "
            "the errors of failed runs do",
            title="Test toast",
            timeout=30,
        )
        await until(pilot, lambda: len(app.screen.query(Toast)) >= 2)  # "Run finished", then this one
        await pilot.pause()
        plots = [plot for plot in app.screen.query(BudgetedPlot) if plot.display and plot.region.area]
        assert len(plots) == 2
        # Cell by cell, what the terminal shows: the toasts somewhere, the plots whole.
        width, height = app.size
        drawn = {(x, y): app.screen.get_widget_at(x, y)[0] for x in range(width) for y in range(height)}
        assert any(isinstance(widget, Toast) for widget in drawn.values())
        for plot in plots:
            region = plot.region
            covering = {
                type(drawn[x, y]).__name__
                for x in range(region.x, region.right)
                for y in range(region.y, region.bottom)
                if drawn[x, y] is not plot
            }
            assert not covering, (plot, covering)
