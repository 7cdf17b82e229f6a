"""Training from the form: t opens it, enter launches, the loss plot moves while it runs."""

from __future__ import annotations

import threading

from jobs.events import Progress
from screens.jobs import JobsScreen
from tests.functional.conftest import SIZE, run_settled, runtime_ready, shown_live, type_into, until

SHORT_SYNTHETIC_TRAIN = {"epochs": "2", "batch_per_replica": "8", "limit_train": "512", "limit_test": "128"}


async def test_t_opens_the_train_form_and_a_short_synthetic_run_plots_live_then_ends_with_val_metrics(make_app):
    first_batch = threading.Event()
    release = threading.Event()

    def hold_after_first_batch(run, event):
        # A runner sink runs on the job thread: holding it here pauses training
        # so the test can look at the live view mid-run. The step's Progress
        # comes after its metrics, which are in events.jsonl by then.
        if isinstance(event, Progress) and event.unit == "step" and event.done >= 1 and not first_batch.is_set():
            first_batch.set()
            release.wait(timeout=600)

    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        try:
            await runtime_ready(pilot)
            # The engine runs on a thread of this test (make_app): its runner takes the sink.
            app.session.lane.engine.server.runner.add_sink(hold_after_first_batch)
            await pilot.press("t")
            assert isinstance(app.screen, JobsScreen)
            form = app.screen.current_form
            assert form.spec.name == "train"
            form.set_value("source", "synthetic")
            for name, value in SHORT_SYNTHETIC_TRAIN.items():
                await type_into(pilot, form.field(name).input, value)
            await pilot.press("enter")  # in the form's last field typed
            live = shown_live(app)
            assert live is not None and live.model.job == "train"

            view = app.screen.view
            await until(
                pilot,
                lambda: (
                    first_batch.is_set()
                    and view.plot_for("loss") is not None
                    and view.plot_for("loss").points_drawn > 0
                ),
                timeout=180,
            )
            assert live.model.status == "running"
            drawn_mid_run = view.plot_for("loss").points_drawn
        finally:
            release.set()
        await run_settled(pilot, live, timeout=240)
        model = live.model
        assert model.status == "done", model.error
        assert {"val_loss", "val_accuracy", "test_accuracy"} <= set(model.last_metrics())
        loss_plot = view.plot_for("loss")
        assert loss_plot.points_drawn > drawn_mid_run
        assert {"train (smoothed)", "val (epoch)"} <= {line.label for line in loss_plot.lines}
        assert view.plot_for("accuracy") is not None and view.plot_for("examples_per_second") is not None
