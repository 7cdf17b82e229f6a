"""Watched-plot lag: how far a watched run's loss plot on screen is behind its progress row.

Issue 26, item 2: a ``tpudash.record`` loop showed progress 231 → 256 → 277
while the chart's last step read 216 → 255 → 276, 3–4 s behind. Here a
writer thread records a step (a loss and the progress) every
``STEP_SECONDS`` into a run the dashboard watches (its detail screen, as a
user opens it from History), and at every UI tick the benchmark reads what
is on screen: the step the progress row shows and the last step of the loss
plot's text shown (the build that landed, not the data handed to plotext).
Each time the progress row shows a new step, the benchmark waits for the
plot's build in flight to land (plotext builds in a worker thread) and
takes the time between the two: the lag a user sees between the progress
and the plot. It also counts updates whose plot, once landed, still ended
before the step the progress showed (0 when both come from the same read).
The target is one beat, 0.5 s (the dashboard draws both on its display beat,
``tpudash.format.DISPLAY_BEAT_SECONDS``).
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
import time
from pathlib import Path

from tests.benchmarks.harness import Result, median, percentile

STEP_SECONDS = 0.01
TARGET_LAG_SECONDS = 0.5
TIMEOUT = 60.0


def _writer(recorder, steps: int, stop: threading.Event) -> None:
    from jobs.events import Metric, Progress, RunFinished

    for step in range(1, steps + 1):
        if stop.is_set():
            break
        recorder.record(Metric("loss", 10.0 / step, step))
        recorder.record(Progress(step, steps, "step"))
        time.sleep(STEP_SECONDS)  # the user's training step: the pace of the run, not a wait for anything
    recorder.record(RunFinished("done", {}))


async def watch(seconds: float) -> dict:
    from jobs.events import RunStarted
    from screens.run_detail import RunDetailScreen
    from tpudash.config import Settings
    from tpudash.runs.store import RunStore
    from tpudash.tui.app import TpudashApp
    from tpudash.tui.plots import MetricPlot

    last_step_of_version: dict[tuple[int, int], float] = {}
    replot = MetricPlot.replot

    def remembering_replot(plot: MetricPlot) -> None:
        # Which step each version of the plot's data ends at: the text on screen is of one version.
        replot(plot)
        drawn = plot.drawn_series.get("train")
        if drawn and drawn[0]:
            last_step_of_version[(id(plot), plot.data_version)] = drawn[0][-1]

    runs_dir = Path(tempfile.mkdtemp(prefix="tpudash-bench-lag-"))
    run_id = "20260101-000000-record-abc123"
    recorder = RunStore(runs_dir).create(run_id, "record", {}, {}, source="record")
    recorder.record(RunStarted(run_id, "record", {}, {}, time.time()))
    steps = int(seconds / STEP_SECONDS)
    stop = threading.Event()
    lags: list[float] = []
    behind = 0
    MetricPlot.replot = remembering_replot  # type: ignore[method-assign]
    try:
        app = TpudashApp(Settings(runs_dir=runs_dir))
        async with app.run_test(size=(160, 48)):
            screen = RunDetailScreen(run_id)
            await app.push_screen(screen)
            writer = threading.Thread(target=_writer, args=(recorder, steps, stop), daemon=True)
            writer.start()
            deadline = time.monotonic() + seconds + TIMEOUT
            shown_progress = ""
            while writer.is_alive() and time.monotonic() < deadline:
                await asyncio.wait_for(app.next_tick(), TIMEOUT)
                rows = list(screen.view._progress_rows.values()) if screen.loaded else []
                progress = str(rows[0].note).split("/")[0] if rows else ""
                plot = screen.view.plot_for("loss") if screen.loaded else None
                if not progress or progress == shown_progress or plot is None:
                    continue
                # The progress row shows a new step: how long until the plot's text on screen reaches it.
                shown_progress, progress_shown_at = progress, time.perf_counter()
                await asyncio.wait_for(plot.drawn(), TIMEOUT)
                plotted = last_step_of_version.get((id(plot), plot.shown.data_version)) if plot.shown else None
                if plotted is None or plotted < int(progress):
                    behind += 1
                lags.append(time.perf_counter() - progress_shown_at)
            stop.set()
            writer.join(TIMEOUT)
    finally:
        MetricPlot.replot = replot  # type: ignore[method-assign]
    return {"lags": lags, "steps": steps, "behind": behind}


def run(quick: bool) -> list[Result]:
    from tpudash.format import DISPLAY_BEAT_SECONDS

    measured = asyncio.run(watch(3.0 if quick else 20.0))
    lags = measured["lags"]
    if not lags:
        raise RuntimeError("the watched run's plot never showed while its progress did")
    p95 = percentile(lags, 0.95)
    return [
        Result(
            benchmark="plot_lag",
            figure=f"watched run: progress row shows a step → loss plot on screen shows it, p95 of {len(lags)}",
            value=p95,
            unit="s",
            baseline_name="display beat",
            baseline=DISPLAY_BEAT_SECONDS,
            ratio=p95 / DISPLAY_BEAT_SECONDS,
            target=f"≤ {TARGET_LAG_SECONDS:g} s (one beat)",
            met=p95 <= TARGET_LAG_SECONDS,
            samples={"lag_seconds": lags},
            notes=f"median {median(lags) * 1000:.1f} ms, max {max(lags) * 1000:.1f} ms; updates whose plot landed "
            f"short of the progress's step: {measured['behind']} of {len(lags)}; a step every "
            f"{STEP_SECONDS * 1000:g} ms, {measured['steps']} steps, the run's detail screen at 160×48",
        )
    ]
