"""What the dashboard's own process spends while it shows a training: CPU by thread, and painting by widget.

The overhead benchmark's dashboard side (``overhead_sides.run_tui``: the TUI
under Pilot, the train job in its engine process) runs here, in this
process, while a sampler reads each of this process's threads' CPU time
from /proc four times a second, every widget's ``render_lines`` is timed,
and so is every frame Textual draws (a frame repaints every widget under
the union of what changed, so it is grouped by that union) and every full
layout (a layout draws a frame of the whole screen). Only what falls between the first and the last epoch's end counts
(the marginal epochs the overhead benchmark measures); the engine's CPU is
its own process's and is not included. Prints one JSON line::

    python -m tests.benchmarks.dashboard_cost light|cnn [--epochs N]

More epochs than the overhead benchmark's five give a longer window, so a
smaller cost can be told from the noise (a change to the UI's timers, say).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import psutil

SAMPLE_SECONDS = 0.25


class ThreadCpu:
    """This process's CPU seconds per thread name (digits and suffixes dropped), sampled on a thread of its own."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cost-sampler", daemon=True)

    def __enter__(self) -> ThreadCpu:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        process = psutil.Process()
        while not self._stop.is_set():
            names = {thread.native_id: thread.name for thread in threading.enumerate()}
            by_name: dict[str, float] = defaultdict(float)
            for thread in process.threads():
                name = names.get(thread.id, "native").split("(")[0].rstrip("-0123456789 _")
                by_name[name] += thread.user_time + thread.system_time
            self.samples.append((time.time(), dict(by_name)))
            self._stop.wait(SAMPLE_SECONDS)

    def cores_between(self, start: float, end: float) -> dict[str, float]:
        """Each thread's CPU seconds per second of wall time from ``start`` to ``end`` (Unix times)."""

        def at(moment: float) -> dict[str, float]:
            before = [sample for stamp, sample in self.samples if stamp <= moment]
            return before[-1] if before else self.samples[0][1]

        first, last = at(start), at(end)
        return {name: (seconds - first.get(name, 0.0)) / (end - start) for name, seconds in last.items()}


def timed_paints() -> list[tuple[float, str, float]]:
    """(Unix time, widget, seconds) of every ``Widget.render_lines`` from now on."""
    from textual.widget import Widget

    paints: list[tuple[float, str, float]] = []
    render_lines = Widget.render_lines

    def timed(widget, crop):
        started = time.perf_counter()
        try:
            return render_lines(widget, crop)
        finally:
            paints.append((time.time(), f"{type(widget).__name__}#{widget.id}", time.perf_counter() - started))

    Widget.render_lines = timed  # type: ignore[method-assign]
    return paints


def timed_frames() -> tuple[list[tuple[float, str, float]], list[tuple[float, float]]]:
    """(Unix time, the screen region it covered, UI thread CPU seconds) of every frame from now on, and
    (Unix time, UI thread CPU seconds) of every full layout, its frame included."""
    from textual._compositor import Compositor
    from textual.geometry import Region
    from textual.screen import Screen

    frames: list[tuple[float, str, float]] = []
    layouts: list[tuple[float, float]] = []
    covered: list[str] = []
    render_update, compositor_refresh, refresh_layout = (
        Compositor.render_update,
        Screen._compositor_refresh,
        Screen._refresh_layout,
    )

    def noted_update(compositor, *args, **kwargs):
        changed = compositor._dirty_regions
        region = Region.from_union(list(changed)) if changed else None
        covered.append(f"{region.width}x{region.height} at y={region.y}" if region else "whole screen")
        return render_update(compositor, *args, **kwargs)

    def timed_frame(screen):
        started, covered[:] = time.thread_time(), []
        try:
            return compositor_refresh(screen)
        finally:
            frames.append((time.time(), covered[0] if covered else "nothing", time.thread_time() - started))

    def timed_layout(screen, *args, **kwargs):
        started = time.thread_time()
        try:
            return refresh_layout(screen, *args, **kwargs)
        finally:
            layouts.append((time.time(), time.thread_time() - started))

    Compositor.render_update = noted_update  # type: ignore[method-assign]
    Screen._compositor_refresh = timed_frame  # type: ignore[method-assign]
    Screen._refresh_layout = timed_layout  # type: ignore[method-assign]
    return frames, layouts


def main(argv: list[str]) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ["TPUDASH_ENGINE_LOCK"] = str(Path(tempfile.mkdtemp(prefix="tpudash-cost-")) / "engine.lock")
    from tests.benchmarks.overhead_sides import SETUPS, run_tui

    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.dashboard_cost")
    parser.add_argument("setup", nargs="?", choices=tuple(SETUPS), default="light")
    parser.add_argument("--epochs", type=int, default=None, help="epochs to train (default: the setup's own, 5)")
    args = parser.parse_args(argv)
    setup = SETUPS[args.setup][0]
    if args.epochs is not None:
        setup = dataclasses.replace(setup, epochs=args.epochs)
    paints = timed_paints()
    frames, layouts = timed_frames()
    with ThreadCpu() as cpu:
        _, ends = run_tui(setup)
    start, end = ends[0], ends[-1]
    threads = cpu.cores_between(start, end)
    by_widget: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for stamp, widget, seconds in paints:
        if start <= stamp <= end:
            by_widget[widget][0] += 1
            by_widget[widget][1] += seconds
    wall = end - start
    by_region: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for stamp, region, seconds in frames:
        if start <= stamp <= end:
            by_region[region][0] += 1
            by_region[region][1] += seconds
    layouts_seen = [seconds for stamp, seconds in layouts if start <= stamp <= end]
    result = {
        "setup": args.setup,
        "seconds": round(wall, 2),
        "process_cores": round(sum(value for name, value in threads.items() if name != "cost-sampler"), 4),
        "thread_cores": {name: round(value, 4) for name, value in sorted(threads.items(), key=lambda kv: -kv[1])},
        "painting_ms_per_second": round(sum(seconds for _, seconds in by_widget.values()) / wall * 1000, 1),
        "paints": {
            widget: {"per_second": round(count / wall, 2), "ms_per_second": round(seconds / wall * 1000, 2)}
            for widget, (count, seconds) in sorted(by_widget.items(), key=lambda kv: -kv[1][1])[:12]
        },
        "frames_ms_per_second": round(sum(seconds for _, seconds in by_region.values()) / wall * 1000, 1),
        "frames": {
            region: {"per_second": round(count / wall, 2), "mean_ms": round(seconds / count * 1000, 2)}
            for region, (count, seconds) in sorted(by_region.items(), key=lambda kv: -kv[1][1])[:6]
        },
        "layouts": {
            "per_second": round(len(layouts_seen) / wall, 2),
            "ms_per_second": round(sum(layouts_seen) / wall * 1000, 2),
        },
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
