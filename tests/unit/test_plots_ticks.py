"""Axis ticks: evenly spaced on a 1-2-5 step, covering the data (issue 26, 5.4)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from tpudash.tui.plots import nice_ticks

finite = st.floats(min_value=-1e9, max_value=1e9, allow_nan=False, allow_infinity=False)


@given(finite, finite, st.integers(min_value=3, max_value=8))
def test_ticks_are_even_nice_cover_the_data_and_stay_within_the_count(low, high, most):
    ticks, labels = nice_ticks(low, high, most)
    low, high = min(low, high), max(low, high)
    assert 1 <= len(ticks) <= most and len(labels) == len(ticks)
    assert ticks[0] <= low + 1e-9 * max(1.0, abs(low)) and ticks[-1] >= high - 1e-9 * max(1.0, abs(high))
    if len(ticks) > 1:
        steps = [b - a for a, b in zip(ticks, ticks[1:])]
        assert max(steps) - min(steps) <= 1e-6 * steps[0]
        mantissa = steps[0] / 10 ** math.floor(math.log10(steps[0]))
        assert any(math.isclose(mantissa, nice, rel_tol=1e-6) for nice in (1, 2, 5, 10))
    assert len(set(labels)) == len(labels)  # labels carry enough decimals to tell ticks apart


def test_the_issues_axes():
    # The step axis reached 24 while plotext's ended at 18.2; the y axes had uneven steps.
    assert nice_ticks(0, 24, 5)[1] == ["0", "10", "20", "30"]
    assert nice_ticks(0, 100, 5)[1] == ["0", "50", "100"]
    assert nice_ticks(0.39, 2.32, 6)[1] == ["0.0", "0.5", "1.0", "1.5", "2.0", "2.5"]


def test_spans_no_float_step_can_divide_are_one_tick_not_an_error():
    # Hypothesis found 0 to 5e-324 (log10 of a step that underflows to 0); 1e308 apart overflows.
    assert nice_ticks(0.0, 5e-324, 3) == ([0.0], ["0"])
    assert len(nice_ticks(-1e308, 1e308, 5)[0]) == 1
