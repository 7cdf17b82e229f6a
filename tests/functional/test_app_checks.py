"""The quick keys: m runs the matmul check, r replica-matmul, g gradient descent; the run view shows their results."""

from __future__ import annotations

import pytest
from textual.widgets import DataTable, Static

from screens.run import RunScreen
from tests.functional.conftest import SIZE, run_settled, runtime_ready, shown_live, until
from tpudash.format import short_device_names
from tpudash.tui.plots import PathPlot, ReplicaBarPlot

WALKTHROUGH_FIGURE = "0.0022596875205636024 @ [0.01152921 0.04611686]"


async def test_m_runs_the_matmul_check_and_shows_a_passing_row_per_device_and_a_chart(make_app, runtime):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await runtime_ready(pilot)
        await pilot.press("m")
        live = shown_live(app)
        assert live is not None and live.model.job == "matmul"
        await run_settled(pilot, live)
        assert isinstance(app.screen, RunScreen)
        assert live.model.status == "done"
        view = app.screen.view
        table = view.query_one(".result-table", DataTable)
        rows = [table.get_row_at(index) for index in range(table.row_count)]
        # Device names as short as still tells them apart, as the CLI prints them.
        short = short_device_names(runtime.device_names)
        assert [row[0] for row in rows] == [short[name] for name in runtime.device_names]
        assert len(set(short.values())) == 8
        assert all(row[4] == "pass" for row in rows)
        chart = view.query_one("#replica-plot", ReplicaBarPlot)
        assert len(chart.values) == 8 and all(value > 0 for value in chart.values)
        assert chart.display and not view.query_one("#replica-note", Static).display
        assert chart.title == "gflops"
        # The Devices screen now shows the verdict per device.
        await pilot.press("d")
        devices = app.screen.query_one("#device-table", DataTable)
        verdicts = [str(devices.get_row_at(index)[-1]) for index in range(devices.row_count)]
        assert all(verdict.startswith("✓ pass") and verdict.endswith("GFLOP/s") for verdict in verdicts), verdicts
        # The verdicts arrived after the rows: the column grew to show them whole.
        column = devices.columns["last check"]
        assert column.get_render_width(devices) >= max(len(verdict) for verdict in verdicts) + 2


async def test_g_runs_gradient_descent_and_shows_the_walkthroughs_figure_with_the_params_that_applied(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await runtime_ready(pilot)
        await pilot.press("g")
        live = shown_live(app)
        await run_settled(pilot, live)
        view = app.screen.view
        assert live.model.status == "done"
        assert WALKTHROUGH_FIGURE in str(view.query_one("#run-outcome", Static).content)
        assert WALKTHROUGH_FIGURE in str(view.query_one("#run-summary", Static).content)
        steps = live.model.tracks[("loss", "train", "step")].count
        assert steps >= 20
        loss_plot = view.plot_for("loss")
        assert loss_plot is not None and loss_plot.points_drawn == steps
        path = view.query_one(PathPlot)
        assert path.points_drawn == steps
        # The path starts where the descent started, not one step in.
        assert path.markers["start"] == (1.0, 4.0)
        assert path.markers["end"] == pytest.approx((0.01152921, 0.04611686))
        # Momentum has no effect with optimizer=sgd: the run's params line leaves it out.
        params_line = str(view.query_one("#run-params", Static).content)
        assert "optimizer=sgd" in params_line and "learning_rate=0.1" in params_line
        assert "momentum" not in params_line


async def test_r_shows_a_sentence_not_an_empty_chart_when_every_replica_is_exact(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await runtime_ready(pilot)
        await pilot.press("r")
        live = shown_live(app)
        await run_settled(pilot, live)
        assert live.model.status == "done"
        errors = live.model.replicas["max abs error"].values
        assert len(errors) == 8 and all(error == 0 for error in errors)  # small integers on CPU: exact
        view = app.screen.view
        await pilot.click("#--content-tab-tab-replicas")  # as a user picks the tab: the view keeps it
        await until(pilot, lambda: view.query_one("#run-tabs").active == "tab-replicas")
        note = view.query_one("#replica-note", Static)
        assert note.display and note.region.area
        assert str(note.content) == "max abs error is exactly 0 on all 8 replicas."
        assert not view.query_one("#replica-plot", ReplicaBarPlot).display


async def test_a_run_that_ends_without_per_replica_values_says_why(make_app, job_gate):
    job_gate.release.set()
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await runtime_ready(pilot)
        live = app.session.launch_by_name("test-steps")
        await run_settled(pilot, live)
        await pilot.press("v")
        view = app.screen.view
        await pilot.click("#--content-tab-tab-replicas")  # as a user picks the tab: the view keeps it
        await until(pilot, lambda: view.query_one("#run-tabs").active == "tab-replicas")
        assert live.model.status == "done" and not live.model.replicas
        note = view.query_one("#replica-note", Static)
        assert note.display and note.region.area
        assert str(note.content).startswith("This run reported no per-replica values: test-steps does not report")
        assert "waiting" not in str(note.content)
        assert not view.query_one("#replica-plot", ReplicaBarPlot).display
