"""The headless live display redraws itself at most four times a second (issue 37).

Each redraw of rich's live display renders every bar on rich's own thread,
beside the training: at rich's default of ten a second it cost 1.6 % of a
core, about 3 ms of every step of the light benchmark.
"""

from __future__ import annotations

import io

from rich.console import Console

from tpudash.cli.sinks import ConsoleSink


def test_the_live_display_redraws_itself_at_most_four_times_a_second():
    sink = ConsoleSink(Console(file=io.StringIO(), force_terminal=True, width=100))
    assert sink._progress.live.refresh_per_second <= 4
    assert sink._progress.live.auto_refresh  # the clocks still move between a run's events
