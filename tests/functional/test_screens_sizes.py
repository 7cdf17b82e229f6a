"""Devices, History and the session log at 80×24 and after a resize: every column says something, nothing is cut."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from textual.widgets import DataTable, RichLog

from tests.functional.conftest import runtime_ready, until
from tests.functional.test_app_80x24 import SMALL, screen_rows

LARGE = (160, 48)
# A training run's final metrics as brief_metrics orders them: held-out splits first.
TRAINING_METRICS = {"test_accuracy": 0.86, "test_loss": 0.44, "val_accuracy": 0.924674, "val_loss": 0.188315}
GRADIENT_METRICS = {"loss": 4.69319e-07, "x0": 0.000166153, "x1": 0.000664614}
# TensorFlow's first words on fd 2, the line a user saw cut at the pane's edge after a resize.
ONEDNN_LINE = (
    "I0000 00:00:1795616048.815109    8055 port.cc:153] oneDNN custom operations are on. You may see slightly "
    "different numerical results due to floating-point round-off errors from different computation orders. "
    "To turn them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`."
)
# What Textual draws a horizontal scrollbar's thumb with: a pane whose lines are cut shows them.
SCROLLBAR_BLOCKS = set("▉▊▋▌▍▎▏")


def write_finished_run(runs_dir: Path, run_id: str, job: str, final_metrics: dict, *, started: float, **extra) -> None:
    """A finished run as its run.json lists it (History reads nothing else)."""
    run_dir = runs_dir / run_id
    run_dir.mkdir(parents=True)
    meta = {
        "run_id": run_id,
        "job": job,
        "params": {},
        "runtime": {},
        "status": "done",
        "started": started,
        "finished": started + 97.0,
        "final_metrics": final_metrics,
        **extra,
    }
    (run_dir / "run.json").write_text(json.dumps(meta))


def write_history(runs_dir: Path) -> None:
    write_finished_run(runs_dir, "20261117-100640-train-0a1b2c", "train", TRAINING_METRICS, started=1_795_000_000.0)
    write_finished_run(
        runs_dir,
        "20261117-101640-gradient-descent-d4e5f6",
        "gradient-descent",
        GRADIENT_METRICS,
        started=1_795_000_600.0,
        pid="not a pid",  # a damaged field: the run lists with one problem
    )


async def show_history(pilot) -> DataTable:
    await pilot.press("h")
    table = pilot.app.screen.query_one("#history-table", DataTable)
    await until(pilot, lambda: table.row_count == 2)
    return table


def row_band(rows: list[str], first: str, following: str | None) -> list[str]:
    """The screen rows from the one holding ``first`` up to (not including) the one holding ``following``."""
    start = next(index for index, row in enumerate(rows) if first in row)
    end = next((index for index, row in enumerate(rows) if following and following in row), len(rows))
    return rows[start:end] if end > start else rows[start:]


async def test_devices_on_the_cpu_default_have_no_column_empty_in_every_row(make_app):
    app = make_app()
    async with app.run_test(size=LARGE) as pilot:
        await runtime_ready(pilot)
        table = app.screen.query_one("#device-table", DataTable)
        assert table.row_count == 8
        empty = [
            str(column.label)
            for index, column in enumerate(table.ordered_columns)
            if not any(str(table.get_row_at(row)[index]).strip() for row in range(table.row_count))
        ]
        assert empty == []
        assert str(table.get_row_at(0)[-1]) == "not checked"

        # Resized to 80×24, the table still fits: no column out of sight behind a horizontal scrollbar.
        await pilot.resize_terminal(*SMALL)
        await until(pilot, lambda: table.size.width < 80)
        assert table.max_scroll_x == 0
        assert not SCROLLBAR_BLOCKS & set("".join(screen_rows(app)))


async def test_history_at_80x24_shows_whole_final_metrics_and_the_problems(make_app, isolated_runs_dir):
    write_history(isolated_runs_dir)
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        table = await show_history(pilot)
        rows = screen_rows(app)
        assert table.max_scroll_x == 0, "columns hidden to the right"
        gradient = "\n".join(row_band(rows, "gradient-descent", "train"))
        training = "\n".join(row_band(rows, "train ", "devices jobs"))
        # The held-out results first, each whole; the damaged run says so on its own row.
        assert "test_accuracy=0.86" in training and "test_loss=0.44" in training
        assert "loss=4.69319e-07" in gradient and "x0=0.000166153" in gradient
        assert "⚠ 1" in gradient and "⚠" not in training
        assert not SCROLLBAR_BLOCKS & set("".join(rows))

        await pilot.resize_terminal(*LARGE)
        await until(pilot, lambda: "problems" in "".join(screen_rows(app)))
        rows = screen_rows(app)
        training_row = next(row for row in rows if " train " in row)
        assert "test_accuracy=0.86  test_loss=0.44  val_accuracy=0.924674  val_loss=0.188315" in training_row
        assert "⚠ 1" in next(row for row in rows if "gradient-descent" in row)


@dataclass
class SessionLogFile:
    """Where fd 2 would go while the dashboard runs (tests leave fd 2 alone)."""

    log_path: Path

    def stop(self) -> None:
        pass


def pane_text(rows: list[str]) -> str:
    """What the first rounded box on the screen shows, its wrapped lines joined as a reader joins them."""
    top = next(index for index, row in enumerate(rows) if "╭" in row)
    bottom = next(index for index in range(top + 1, len(rows)) if "╰" in rows[index])
    inside = [row.split("│")[1] for row in rows[top + 1 : bottom]]
    return words(" ".join(inside))


def words(text: str) -> str:
    return " ".join(text.split())


async def test_the_session_log_is_wrapped_again_whole_after_a_resize_to_80x24(make_app, tmp_path):
    log_path = tmp_path / "session.log"
    log_path.write_text(ONEDNN_LINE + "\n")
    app = make_app()
    app.host_io.session_log = SessionLogFile(log_path)  # type: ignore[assignment]
    async with app.run_test(size=LARGE) as pilot:
        await pilot.press("l")
        log = app.screen.query_one("#session-log", RichLog)
        await until(pilot, lambda: words(ONEDNN_LINE) in pane_text(screen_rows(app)))

        await pilot.resize_terminal(*SMALL)
        await until(pilot, lambda: log.scrollable_content_region.width < 80)
        rows = screen_rows(app)
        assert words(ONEDNN_LINE) in pane_text(rows)
        assert log.max_scroll_x == 0, "the log's lines are wider than its pane"
        assert not SCROLLBAR_BLOCKS & set("".join(rows))
