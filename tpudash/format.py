"""The dashboard's clock: the display beat and how durations are written.

Textual-free, so the run model, the lane and every screen share it without
importing the app.
"""

from __future__ import annotations

import math
import time

# What a running job changes (clocks, progress bars, log, live plots) is
# redrawn when the clock enters a new second, so all of it lands in one frame
# instead of each change costing its own: during training every frame is CPU
# the training step could have had. (nvitop refreshes every 2 s.)
DISPLAY_BEAT_SECONDS = 1.0


def display_beat() -> int:
    """Which second of the monotonic clock it is (see ``DISPLAY_BEAT_SECONDS``)."""
    return int(time.monotonic() / DISPLAY_BEAT_SECONDS)


def format_seconds(seconds: float | None, precise: bool = True) -> str:
    """``1.7s`` (when ``precise``, under 10 s), ``00:07``, ``03:25``, ``1:02:03``.

    A running clock is shown to the second: a text that changes ten times a
    second would repaint the screen ten times a second.
    """
    if seconds is None or not math.isfinite(seconds):
        return "--:--"
    seconds = max(0.0, seconds)
    minutes, rest = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}:{minutes:02d}:{rest:02d}"
    return f"{seconds:.1f}s" if precise and seconds < 10 else f"{minutes:02d}:{rest:02d}"
