"""The run view lists a cluster's workers: progress, step time, heartbeat age, a straggler and a stale one in words.

A crafted run with three workers' heartbeats (worker 1 takes twice as long a step as
the others, worker 2 stopped beating a minute ago) is shown in a run view at
80×24 and at 160×48: the Workers tab has every worker's row readable, and the
line above the tabs names the straggler and the stale worker.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from textual.app import App, ComposeResult

from tests.functional.test_app_80x24 import screen_rows
from tpudash.runs.backends import LocalRunFiles
from tpudash.runs.model import RunModel
from tpudash.tui.runview import RunView
from tpudash.tui.workers import WorkersTable


def craft_workers(run_dir) -> None:
    (run_dir / "writers").mkdir(parents=True)
    now = time.time()
    for index, (age, step_seconds) in enumerate([(1.0, 0.100), (2.0, 0.200), (60.0, 0.100)]):
        payload = {
            "heartbeat": now - age, "interval": 5.0, "pid": 100 + index, "host": f"10.0.0.{index + 1}:2222",
            "writer": f"tpu-vm-{index}-1", "worker": index, "workers": 3,
            "task": "chief" if index == 0 else "worker", "step": 120, "step_seconds": step_seconds,
            "progress": {"done": 120 - 20 * index, "total": 300, "unit": "step"}, "status": "running",
        }  # fmt: skip
        (run_dir / "writers" / f"tpu-vm-{index}-1.json").write_text(json.dumps(payload))


async def until(pilot, predicate, timeout: float = 30.0) -> None:
    """Let the app run until ``predicate()`` holds (a bounded wait: the read is on a thread worker)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"condition not met within {timeout} s"
        await pilot.pause(0.02)
    await pilot.pause()


class RunViewApp(App):
    def __init__(self, files: LocalRunFiles) -> None:
        super().__init__()
        self.files = files

    def compose(self) -> ComposeResult:
        yield RunView(RunModel(run_id="crafted", job="train", status="running"), id="view")


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
async def test_the_workers_tab_lists_every_worker_with_the_straggler_and_the_stale_one_in_words(tmp_path, size):
    craft_workers(tmp_path)
    app = RunViewApp(LocalRunFiles(tmp_path))
    async with app.run_test(size=size) as pilot:
        view = app.query_one(RunView)
        view.follow_workers(app.files, local=True)

        def table_drawn() -> bool:
            view.sync(force=True)  # the screen's display beat
            return any(table.row_count == 3 for table in view.query(WorkersTable))

        await until(pilot, table_drawn)
        view.query_one("#run-tabs").active = "tab-workers"
        await pilot.pause()
        rows = screen_rows(app)
        text = "\n".join(rows)
        line = next(row for row in rows if "workers:" in row)
        assert "2 of 3 live" in line and "straggler" in text and "worker 1" in text
        assert "stale" in text and "worker 2" in text
        table = view.query_one(WorkersTable).region
        table_rows = [row[table.x : table.right] for row in rows[table.y : table.bottom]]
        heading = table_rows[0]
        for column in ("worker", "task", "host", "progress", "step time", "heartbeat", "state"):
            assert column in heading, "\n".join(table_rows)
        body = "\n".join(table_rows[1:])
        by_worker = {row.split()[0]: row for row in table_rows[1:] if row.split()}
        assert "straggler" in by_worker["1"] and "200 ms" in by_worker["1"], body
        assert "stale" in by_worker["2"] and "ago" in by_worker["2"], body
        assert "live" in by_worker["0"] and "step 120/300" in by_worker["0"] and "100 ms" in by_worker["0"], body
        assert "10.0.0.1" in by_worker["0"], body
        # The state is a word, and styled too: never colour alone.
        cell = view.query_one(WorkersTable).get_cell("1", "state")
        assert str(cell) == "straggler" and cell.style
