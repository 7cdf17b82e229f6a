"""Where a plot's axes put their ticks: evenly spaced on a 1-2-5 × 10^k step, labelled with no more digits than the step needs.

Pure arithmetic (no plotext): ``BudgetedPlot.set_even_ticks``
(``tpudash.tui.plotwidget``) hands the result to plotext.
"""

from __future__ import annotations

import math

# The smallest step whose power of ten is a normal float: below it, 10 ** floor(log10(step)) underflows.
MIN_TICK_STEP = 1e-300


# Tick labels carry at most this many significant digits: a rate of 7987.2 reads 7980 7990, never 7987.2 7987.4.
TICK_DIGITS = 4


def nice_ticks(low: float, high: float, most: int = 5, *, min_step: float = 0.0) -> tuple[list[float], list[str]]:
    """At most ``most`` evenly spaced ticks on a 1-2-5 × 10^k step that cover [low, high], and their labels.

    plotext's own ticks fall at uneven places (``100.0, 83.3, 50.0``) and may stop short of the
    data (an axis ending at 18.2 for steps to 24); labels carry the step's decimals, no more.
    One value (a single epoch's examples/s, one telemetry sample) gets an axis from 0 to it, where
    plotext would put it between two thirds and four thirds of itself (``58.5 87.8 117.0``). The
    step is at least ``min_step`` and keeps labels to ``TICK_DIGITS`` significant digits.
    """
    if not (math.isfinite(low) and math.isfinite(high)):
        return [], []
    if high < low:
        low, high = high, low
    if high == low:
        low, high = (0.0, 1.0) if low == 0 else (min(0.0, low), max(0.0, high))
    most = max(most, 3)  # ticks are multiples of the step: a range across 0 takes three
    largest = max(abs(low), abs(high))
    coarsest_useful = 10 ** (math.floor(math.log10(largest)) - TICK_DIGITS + 1) if largest >= MIN_TICK_STEP else 0.0
    raw = max((high - low) / (most - 1), min_step, coarsest_useful)
    if not math.isfinite(raw) or raw < MIN_TICK_STEP:
        # A span too wide for a float (1e308 apart) or too narrow for a power of ten (5e-324): one value.
        return [low], [format_tick(low, 0)]
    magnitude = 10 ** math.floor(math.log10(raw))
    candidates = (factor * magnitude * 10**power for power in range(4) for factor in (1, 2, 5))
    for step in candidates:
        if step < raw:
            continue
        first, last = math.floor(low / step), math.ceil(high / step)
        if last - first + 1 <= most:
            break
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    ticks = [round(index * step, decimals + 1) for index in range(first, last + 1)]
    return ticks, [format_tick(tick, decimals) for tick in ticks]


def format_tick(value: float, decimals: int) -> str:
    text = f"{value:.{decimals}f}"
    return text.lstrip("-") if float(text) == 0 else text  # never "-0.0"
