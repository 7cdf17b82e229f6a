"""The run view's header shows every value (issue 26, 5.18).

A user saw the params line drop ``limit_test``, the outcome end in ``…precision`` without its value, and a
long last message push the run's state out of the header. Here a run with train's many params ends with a
long last message and a summary line; at 80×24 and at 160×48 (the Run screen's view is 130 columns there,
beside the lane) every ``name=value`` and the whole summary line are on screen, the last message keeps one
line that ends in an ellipsis, and the title (status) and the stage line stay in the header.
"""

from __future__ import annotations

import pytest

from jobs import registry
from jobs.base import JobSpec
from jobs.events import Stage
from tests.functional.conftest import run_settled, runtime_ready, until
from tests.functional.test_app_80x24 import screen_rows
from tpudash.format import format_value

LONG_MESSAGE = (
    "training mnist-cnn (1,199,882 params) on synthetic MNIST-shaped data: 60,000 train / 10,000 test examples; "
    "global batch 1024 = 128 per replica × 8 replicas (CPU); 58 steps per epoch, fit loop, steps_per_execution 1, "
    "precision float32"
)
SUMMARY_LINE = "test_loss 0.4412 · test_accuracy 0.8613 · 1,185 examples/s · precision mixed_bfloat16 · 8 replicas"


def _train_like_job() -> JobSpec:
    """train's params (the many a header must show), stages, a long last message and a summary line; no TensorFlow."""
    train = registry()["train"]

    def run(ctx, params):
        ctx.emit(Stage("building the model", 0, None))
        ctx.emit(Stage("training", 0, None))
        ctx.progress(1, 1, "epoch")
        ctx.log(LONG_MESSAGE)
        return {"line": SUMMARY_LINE, "precision": params["precision"]}

    return JobSpec(name="train", title=train.title, description=train.description, params=train.params, run=run)


def header_rows(app) -> list[str]:
    """The header's rows as a user reads them: from the run's title down to the tabs, the view's columns only."""
    view = app.screen.view
    top = view.query_one("#run-title").region
    tabs = view.query_one("#run-tabs").region
    return [row[view.region.x : view.region.right] for row in screen_rows(app)[top.y : tabs.y]]


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
async def test_every_param_and_the_summary_show_and_the_last_message_keeps_one_line(make_app, test_specs, size):
    spec = _train_like_job()
    app = make_app(job_specs={**test_specs, "train": spec})
    async with app.run_test(size=size) as pilot:
        await runtime_ready(pilot)
        live = app.session.launch_by_name("train", {"precision": "mixed_bfloat16", "limit_test": "512"})
        await run_settled(pilot, live)
        await until(pilot, lambda: app.current_mode == "run" and app.screen.view.model is live.model)
        await app.next_tick()
        await pilot.pause()
        rows = header_rows(app)
        text = " ".join(" ".join(rows).split())
        params = live.model.params
        shown = [f"{param.name}={format_value(params[param.name])}" for param in spec.params if param.applies(params)]
        missing = [pair for pair in shown if pair not in text]
        assert not missing, f"params not on screen: {missing}\n" + "\n".join(rows)
        assert "limit_test=512" in text
        # What it ran on, under the params: the framework, the devices and the strategy.
        runtime_row = next(row.strip() for row in rows if row.strip().startswith("on "))
        assert "TensorFlow" in runtime_row and "MirroredStrategy, 8 replicas" in runtime_row, runtime_row
        assert SUMMARY_LINE in text, "\n".join(rows)
        # The last message: one line of its own, cut with an ellipsis, the start of the message.
        message_rows = [row for row in rows if LONG_MESSAGE[:40] in row]
        assert len(message_rows) == 1, "\n".join(rows)
        assert message_rows[0].rstrip().endswith("…")
        # The state stays in the header: the status in the title, and the stage line.
        assert "done" in rows[0]
        assert any(row.strip().startswith("ready in") for row in rows), "\n".join(rows)
