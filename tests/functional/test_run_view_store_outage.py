"""The run view while its run's store does not answer (issue 38, item 2).

With the bucket stopped mid-run, the run view read ``preparing: tracing and running the first
step · 00:42`` while the engine had finished all 3 epochs: nothing said the store was away, and
the clocks went on counting. Now a line under the title says since when (and how many events the
run's writer on this host holds meanwhile), and the title's and the stage line's clocks stand at
that moment; when the store answers again they run on and the line goes.
"""

from __future__ import annotations

import re
import time
from datetime import datetime
from types import SimpleNamespace

from jobs.events import RunStarted, Stage
from tests.functional.runview_harness import RunViewApp
from tests.functional.test_app_80x24 import screen_rows
from tpudash.runs import storeclient
from tpudash.runs.model import RunModel
from tpudash.runs.uploader import local_run_dir
from tpudash.tui.runview import RunView

RUN_ID = "20261128-003845-train-4be1c0"
# A bucket of this module's own: the store outage record is process-wide, and a thread of an earlier test may
# still be marking its store away (a full run under load drew "since" a moment of this test for gs://b).
URL = "gs://run-view-outage-test/runs"


def preparing_run(started: float) -> RunModel:
    model = RunModel()
    model.apply(RunStarted(RUN_ID, "train", {"epochs": 3}, {}, started), started)
    model.apply(Stage("tracing and running the first step"), started)
    return model


def clock_seconds(text: str) -> list[int]:
    """The mm:ss clocks a line shows, in seconds."""
    return [int(minutes) * 60 + int(seconds) for minutes, seconds in re.findall(r"\b(\d\d):(\d\d)\b", text)]


async def screen_text(pilot) -> str:
    pilot.app.query_one("#view", RunView).sync(force=True)
    await pilot.pause()
    return "\n".join(screen_rows(pilot.app))


class DashboardOf(RunViewApp):
    """The run view in an app whose settings name its runs directory, as the dashboard's do."""

    def __init__(self, model: RunModel, runs_dir: object) -> None:
        super().__init__(model)
        self.settings = SimpleNamespace(runs_dir=runs_dir)


async def test_a_store_that_stopped_answering_is_said_under_the_title_and_the_clocks_stand_at_that_moment():
    away_since = time.time() - 600  # the store stopped answering ten minutes ago, 42 s into the run
    model = preparing_run(away_since - 42)
    # The engine (another process on this host) spilled what the store would not take into the run's local dir.
    spill = local_run_dir(None, RUN_ID) / "events"
    spill.mkdir(parents=True)
    (spill / "host-1-aa-00000007.jsonl").write_text('{"type":"log"}\n' * 446)
    storeclient.mark_unreachable(f"{URL}/{RUN_ID}", away_since, "no answer within 8 s")

    async with DashboardOf(model, URL).run_test(size=(100, 24)) as pilot:
        text = await screen_text(pilot)
        since = datetime.fromtimestamp(away_since).strftime("%H:%M:%S")
        assert f"⚠ store unreachable since {since} · 446 events held locally: shown as of then" in text
        title = next(row for row in text.splitlines() if RUN_ID in row)
        assert "running" in title and "00:42" in title  # not 10:42: nothing is known of the time since
        assert "tracing and running the first step" in text and "10:4" not in text

        storeclient.mark_answered(URL)  # the store answers again: the clocks run on, the line goes
        text = await screen_text(pilot)
        assert "store unreachable" not in text
        title = next(row for row in text.splitlines() if RUN_ID in row)
        assert "00:42" not in title and max(clock_seconds(title)) >= 642  # however long this test took


async def test_an_ended_run_says_nothing_of_its_store():
    storeclient.mark_unreachable(URL, time.time() - 60, "no answer within 8 s")
    model = preparing_run(time.time() - 120)
    model.status, model.finished = "done", time.time() - 90
    async with RunViewApp(model).run_test(size=(100, 24)) as pilot:
        assert "store unreachable" not in await screen_text(pilot)


async def test_only_the_dashboards_own_runs_store_stops_its_clocks(tmp_path):
    # A process may have talked to another store (a copy to a bucket, a test before this one): its outage is not
    # the outage of the runs this dashboard shows.
    away_since = time.time() - 600
    storeclient.mark_unreachable("gs://another-bucket/runs/x", away_since, "no answer within 8 s")
    for runs_dir, stands_still in ((tmp_path / "runs", False), ("gs://another-bucket/runs", True)):
        async with DashboardOf(preparing_run(away_since - 42), runs_dir).run_test(size=(100, 24)) as pilot:
            text = await screen_text(pilot)
            title = next(row for row in text.splitlines() if RUN_ID in row)
            assert ("store unreachable" in text) is stands_still, runs_dir
            assert ("00:42" in title) is stands_still and (max(clock_seconds(title)) >= 642) is not stands_still, title
