"""Target 5: a 1,000,000-point metric history redraws in ≤ 20 ms, flat, in bounded memory.

Two ``RunModel``s (tpudash/runmodel.py, the model the live and History views
draw) are fed ``Metric`` events the way a long training run sends them: a
noisy falling ``batch_loss`` per step and, every 1,000 steps, an epoch's
train and val ``loss``. One gets 1,000 batch points, the other 1,000,000.
Each is shown by its own ``RunView`` in a Textual app under Pilot, side by
side at 180×40, so both loss plots have the size the run view gives its
plots in a 120-column terminal (90 columns beside the 30-column lane).

- **Redraw**: what the view does when new points arrive, timed on the loss
  plot: ``replot()`` (read the bounded series, min/max-decimate to the
  plot's width, hand the lines to plotext) plus ``render()`` (plotext builds
  the figure, Textual parses its ANSI), alternated 1k / 1M, medians of
  wall time (CPU time of the thread beside it, which a loaded machine
  does not inflate).
- **Memory**: resident set growth (VmRSS) while feeding the 1,000,000
  points, beside the growth of simply keeping the same points in two
  Python lists (what an unbounded history would hold), and the points
  every series actually keeps (``DecimatedSeries`` capacity).
"""

from __future__ import annotations

import asyncio
import gc
import math
import random
import statistics
import time
from pathlib import Path

from tests.benchmarks.harness import Result

SMALL_POINTS = 1_000
STEPS_PER_EPOCH = 1_000
APP_SIZE = (180, 40)
REDRAW_TARGET_MS = 20.0
FLAT_RATIO = 1.25
# An unbounded history of the same points grows RSS by tens of MB; a bounded
# one by what the allocator keeps around, a small fraction of that.
MEMORY_FRACTION = 0.10


def rss_bytes() -> int:
    """Current resident set size of this process (VmRSS), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def feed(model, points: int, seed: int = 0) -> None:
    """``points`` per-step losses (and per-epoch train/val losses) into ``model``, one event at a time."""
    from jobs.events import Metric

    noise = random.Random(seed)
    started = time.time()
    for step in range(1, points + 1):
        epoch = (step - 1) // STEPS_PER_EPOCH + 1
        loss = 2.3 * math.exp(-step / (points / 4)) + 0.05 + 0.1 * noise.random()
        model.apply(Metric("batch_loss", loss, step, epoch=epoch), started)
        if step % STEPS_PER_EPOCH == 0:
            model.apply(Metric("loss", loss, step, epoch=epoch), started)
            model.apply(Metric("loss", loss * 1.1, step, epoch=epoch, split="val"), started)


def kept_points(model) -> int:
    return max(len(track.series) for track in model.tracks.values())


def unbounded_growth(points: int) -> int:
    """RSS growth of keeping ``points`` (step, loss) pairs in two lists: the unbounded alternative."""
    gc.collect()
    before = rss_bytes()
    steps = [float(step) for step in range(points)]
    losses = [float(step) * 1e-6 + 0.5 for step in range(points)]
    grown = rss_bytes() - before
    del steps, losses
    return grown


def redraw_seconds(plot) -> tuple[float, float]:
    """(wall, CPU) seconds of one redraw: the replot on the UI thread plus plotext's build (the dashboard
    runs that in a worker thread), both here so the figure is the whole cost; the CPU time is what it
    costs on a core of its own."""
    from tpudash.tui.plots import RenderKey, build_rows

    started, cpu_started = time.perf_counter(), time.thread_time()
    plot.redraw()
    key = RenderKey(plot.data_version, plot.size.width, plot.size.height, plot._plotext_theme)
    plot._cell_styles.strips(plot, build_rows(plot.plt, key))
    return time.perf_counter() - started, time.thread_time() - cpu_started


async def _measure_redraws(small_model, big_model, rounds: int) -> dict:
    from textual.app import App, ComposeResult
    from textual.containers import Horizontal

    from tpudash.tui.runview import RunView

    class TwoRunViews(App):
        def compose(self) -> ComposeResult:
            with Horizontal():
                yield RunView(small_model, id="small")
                yield RunView(big_model, id="big")

    app = TwoRunViews()
    async with app.run_test(size=APP_SIZE) as pilot:
        await pilot.pause()
        plots = {}
        for name in ("small", "big"):
            view = app.query_one(f"#{name}", RunView)
            view.sync(force=True)
            await pilot.pause()
            plots[name] = view.plot_for("loss")
        if any(plot is None for plot in plots.values()):
            raise RuntimeError("the run view drew no loss plot")
        sizes = {name: tuple(plot.size) for name, plot in plots.items()}
        times = {"small": [], "big": []}
        cpu_times = {"small": [], "big": []}
        for _ in range(rounds):
            for name in ("small", "big"):
                wall, cpu = redraw_seconds(plots[name])
                times[name].append(wall)
                cpu_times[name].append(cpu)
        drawn = {name: plot.points_drawn for name, plot in plots.items()}
    return {"times": times, "cpu_times": cpu_times, "sizes": sizes, "drawn": drawn}


def run(quick: bool) -> list[Result]:
    from tpudash.runs.model import RunModel
    from tpudash.runs.series import DEFAULT_SERIES_CAPACITY

    big_points = 20_000 if quick else 1_000_000
    rounds = 5 if quick else 40
    small_model = RunModel(run_id="small", job="train", status="running")
    feed(small_model, SMALL_POINTS)

    gc.collect()
    rss_before = rss_bytes()
    big_model = RunModel(run_id="big", job="train", status="running")
    feed_started = time.perf_counter()
    feed(big_model, big_points)
    feed_seconds = time.perf_counter() - feed_started
    gc.collect()
    model_growth = rss_bytes() - rss_before
    list_growth = unbounded_growth(big_points)

    measured = asyncio.run(_measure_redraws(small_model, big_model, rounds))
    small_ms = statistics.median(measured["times"]["small"]) * 1000
    big_ms = statistics.median(measured["times"]["big"]) * 1000
    ratio = big_ms / small_ms
    kept = kept_points(big_model)
    bounded = kept <= DEFAULT_SERIES_CAPACITY and model_growth <= MEMORY_FRACTION * max(list_growth, 1)
    mib = 1024 * 1024
    plot_size = "×".join(str(side) for side in measured["sizes"]["big"])
    return [
        Result(
            benchmark="history",
            figure=f"loss plot redraw, {big_points:,} points ({plot_size} cells)",
            value=big_ms,
            unit="ms",
            baseline_name=f"{SMALL_POINTS:,} points",
            baseline=small_ms,
            ratio=ratio,
            target=f"≤ {REDRAW_TARGET_MS:g} ms, ratio ≤ {FLAT_RATIO}",
            met=big_ms <= REDRAW_TARGET_MS and ratio <= FLAT_RATIO,
            samples={
                "redraw_seconds": measured["times"],
                "redraw_cpu_seconds": measured["cpu_times"],
                "points_drawn": measured["drawn"],
                "plot_sizes": measured["sizes"],
            },
            notes=f"p95 {_p95(measured['times']['big']) * 1000:.1f} ms; CPU time median "
            f"{statistics.median(measured['cpu_times']['big']) * 1000:.1f} ms (1M) / "
            f"{statistics.median(measured['cpu_times']['small']) * 1000:.1f} ms (1k); the plots draw "
            f"{measured['drawn']['big']} / {measured['drawn']['small']} points",
        ),
        Result(
            benchmark="history",
            figure=f"RSS growth feeding {big_points:,} points",
            value=model_growth / mib,
            unit="MiB",
            baseline_name="same points in 2 lists",
            baseline=list_growth / mib,
            ratio=model_growth / max(list_growth, 1),
            target=f"kept ≤ {DEFAULT_SERIES_CAPACITY}/series, ratio ≤ {MEMORY_FRACTION}",
            met=bounded,
            samples={
                "rss_growth_bytes": model_growth,
                "unbounded_list_growth_bytes": list_growth,
                "kept_points_per_series": kept,
                "feed_seconds": feed_seconds,
                "events_per_second": big_points / feed_seconds,
            },
            notes=f"{kept} points kept of {big_points:,}; fed at {big_points / feed_seconds:,.0f} events/s",
        ),
    ]


def _p95(samples: list[float]) -> float:
    from tests.benchmarks.harness import percentile

    return percentile(samples, 0.95)
