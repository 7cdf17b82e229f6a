"""Issue 26: key → changed pane in a real terminal (tmux), cross-checking key_latency's Pilot figure.

``python -m tpudash`` (the CPU default, a runs directory and an engine lock
of its own) runs in a detached tmux session, 160×48. Once the pane shows
Devices with the engine ready, and the dashboard process has gone quiet
(its CPU time grows by under ``QUIET_CPU_FRACTION`` of a core over
``QUIET_WINDOW_SECONDS``: the screens composed ahead, the idle time a user
gives it), a key goes in with ``tmux send-keys`` and the pane is polled with
``tmux capture-pane -p`` until it shows the new screen's marker and no
longer the old one's. The clock runs from just before ``send-keys`` to the
capture that shows it.

- First visits: a fresh dashboard per key (``d j h v l ?``); ``d`` is the
  first return to Devices, after an unmeasured ``v``.
- Re-visits: in one more dashboard, a warm-up round of every key, then
  rounds of ``d j h v l ?``, each press once the pane has settled.

The floor and the grain of this figure is one poll: a ``capture-pane``
(a tmux client process, measured and reported) plus ``POLL_SECONDS``. The
engine is idle here (no job): the loaded figure is key_latency's.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tests.benchmarks.harness import Result, median, percentile, process_cpu_seconds
from tests.benchmarks.tmux import POLL_SECONDS, TmuxTerminal, tmux_available

PROJECT = Path(__file__).resolve().parents[2]
SIZE = (160, 48)
KEYS = ("d", "j", "h", "v", "l", "?")
MARKER_FOR_KEY = {
    "d": "Logical devices",
    "j": "replica-matmul  [r]",
    "h": "enter open · space mark",
    "v": " Plots  Replicas  Results ",
    "l": "Session log ",
    "?": "Keys (anywhere",
}
ENGINE_READY = "engine ready"
READY_TIMEOUT = 120.0
KEY_TIMEOUT = 10.0
QUIET_WINDOW_SECONDS = 0.25
QUIET_CPU_FRACTION = 0.1
QUIET_TIMEOUT = 30.0


def _environment(scratch: Path) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", str(scratch)),
        "TERM": "xterm-256color",
        "TPUDASH_RUNS_DIR": str(scratch / "runs"),
        "TPUDASH_ENGINE_LOCK": str(scratch / "engine.lock"),
        "XDG_DATA_HOME": str(scratch / "xdg"),
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "TFDS_DISABLE_GCS": "1",
    }


def _screen_of(text: str) -> str | None:
    shown = [key for key, marker in MARKER_FOR_KEY.items() if marker in text]
    return shown[0] if len(shown) == 1 else None


class Dashboard:
    """``python -m tpudash`` in tmux: ready, quiet, and a timed key → changed pane."""

    def __init__(self) -> None:
        scratch = Path(tempfile.mkdtemp(prefix="tpudash-bench-tmux-"))
        self.terminal = TmuxTerminal(
            [sys.executable, "-m", "tpudash"], _environment(scratch), size=SIZE, cwd=str(PROJECT)
        )
        self.shown = "d"

    def __enter__(self) -> Dashboard:
        self.terminal.wait_for(
            lambda text: MARKER_FOR_KEY["d"] in text and ENGINE_READY in text, READY_TIMEOUT, "Devices, engine ready"
        )
        self.pid = self.terminal.pane_pid()
        return self

    def __exit__(self, *exc: object) -> None:
        self.terminal.close()

    def wait_quiet(self) -> None:
        """Until the dashboard process uses under QUIET_CPU_FRACTION of a core over a QUIET_WINDOW_SECONDS window."""
        deadline = time.perf_counter() + QUIET_TIMEOUT
        while time.perf_counter() < deadline:
            before = process_cpu_seconds(self.pid)
            time.sleep(QUIET_WINDOW_SECONDS)  # the window over which the process's CPU time is read
            after = process_cpu_seconds(self.pid)
            if before is None or after is None:
                raise RuntimeError(f"the dashboard has exited:\n{self.terminal.capture()}")
            if after - before < QUIET_CPU_FRACTION * QUIET_WINDOW_SECONDS:
                return
        raise RuntimeError(f"the dashboard did not go quiet within {QUIET_TIMEOUT:g} s")

    def press(self, key: str) -> float:
        """Seconds from ``send-keys`` to the capture that shows ``key``'s screen (and not the one before)."""
        started = time.perf_counter()
        self.terminal.send(key)
        seen, _ = self.terminal.wait_for(lambda text: _screen_of(text) == key, KEY_TIMEOUT, f"{key}'s screen")
        self.shown = key
        return seen - started

    def capture_seconds(self, samples: int = 20) -> float:
        """Median wall time of one ``capture-pane``: with POLL_SECONDS, the grain of every figure here."""
        times = []
        for _ in range(samples):
            started = time.perf_counter()
            self.terminal.capture()
            times.append(time.perf_counter() - started)
        return statistics.median(times)


def run(quick: bool) -> list[Result]:
    if not tmux_available():
        raise RuntimeError("tmux is not installed: this benchmark drives the dashboard in it")
    first_keys = ("j",) if quick else KEYS
    first: dict[str, float] = {}
    for key in first_keys:
        with Dashboard() as dashboard:
            dashboard.wait_quiet()
            if key == dashboard.shown:
                dashboard.press("v")
                dashboard.wait_quiet()
            first[key] = dashboard.press(key)
    rounds = 1 if quick else 8
    again: dict[str, list[float]] = {key: [] for key in KEYS}
    with Dashboard() as dashboard:
        dashboard.wait_quiet()
        grain = dashboard.capture_seconds()
        for round_index in range(rounds + 1):
            for key in ("v", *KEYS) if round_index == 0 else KEYS:
                if key == dashboard.shown:
                    continue
                seconds = dashboard.press(key)
                if round_index > 0:  # round 0 is the warm-up: every screen's first visit
                    again[key].append(seconds)
                dashboard.wait_quiet()
    revisits = [seconds for values in again.values() for seconds in values]
    floor_ms = (grain + POLL_SECONDS) * 1000

    def listing(values: dict) -> str:
        return ", ".join(f"{key} {seconds * 1000:.0f}" for key, seconds in values.items())

    per_key = ", ".join(
        f"{key} {median(values) * 1000:.0f}/{percentile(values, 0.95) * 1000:.0f}"
        for key, values in again.items()
        if values
    )
    grain_note = f"grain: one poll = capture-pane {grain * 1000:.1f} ms + sleep {POLL_SECONDS * 1000:g} ms"
    return [
        Result(
            benchmark="tmux_keys",
            figure=f"tmux 160×48: FIRST visit, key → changed pane, p95 of {len(first)} fresh dashboards, engine idle",
            value=percentile(list(first.values()), 0.95) * 1000,
            unit="ms",
            target="p95 ≤ 50 ms",
            met=percentile(list(first.values()), 0.95) * 1000 <= 50,
            samples={"first_visit_seconds": first, "capture_seconds": grain},
            notes=f"per key (ms): {listing(first)}; median {median(list(first.values())) * 1000:.0f} ms; {grain_note}",
        ),
        Result(
            benchmark="tmux_keys",
            figure=f"tmux 160×48: re-visits, key → changed pane, p95 of {len(revisits)} presses, engine idle",
            value=percentile(revisits, 0.95) * 1000,
            unit="ms",
            target="p95 ≤ 16 ms",
            met=percentile(revisits, 0.95) * 1000 <= 16,
            samples={"revisit_seconds": again, "capture_seconds": grain},
            notes=f"p50 {median(revisits) * 1000:.1f} ms; per key p50/p95 (ms): {per_key}; {grain_note}; "
            f"floor ≈ {floor_ms:.1f} ms",
        ),
        Result(
            benchmark="tmux_keys",
            figure="tmux 160×48: re-visits, p50",
            value=median(revisits) * 1000,
            unit="ms",
            notes=f"the figure's floor (send-keys + one poll) ≈ {floor_ms:.1f} ms",
        ),
    ]
