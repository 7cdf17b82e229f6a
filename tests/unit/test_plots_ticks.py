"""Axis ticks: evenly spaced on a 1-2-5 step, covering the data (issue 26, 5.4); one value and rates read
round (issue 38, item 14)."""

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


def test_one_value_gets_round_ticks_from_zero_to_it_not_plotexts_thirds():
    # Issue 38, item 14: one epoch's examples/s read "58.5 87.8 117.0" and "7987.2" (plotext's axis around one value).
    assert nice_ticks(7987.2, 7987.2, 5)[1] == ["0", "2000", "4000", "6000", "8000"]
    assert nice_ticks(87.8, 87.8, 6)[1] == ["0", "20", "40", "60", "80", "100"]
    assert nice_ticks(-3.0, -3.0, 5)[1] == ["-3", "-2", "-1", "0"]
    assert nice_ticks(0.0, 0.0, 3)[1] == ["0.0", "0.5", "1.0"]


def test_rates_in_the_thousands_tick_on_integers():
    # A rate that barely moves keeps four significant digits: 7987 7988, never 7987.2 7987.4 7987.6.
    ticks, labels = nice_ticks(7987.2, 7987.9, 5)
    assert labels == ["7987", "7988"] and ticks[0] <= 7987.2 and ticks[-1] >= 7987.9
    assert all("." not in label for label in nice_ticks(7950.5, 8012.25, 6)[1])


def test_an_axis_of_steps_or_seconds_never_ticks_below_its_smallest_step():
    # Issue 38, item 14: one telemetry sample 0.014 s into a run read "0.0071 … 0.0212" seconds.
    assert nice_ticks(0.0141, 0.0141, 5, min_step=1.0) == ([0, 1], ["0", "1"])
    assert nice_ticks(0, 3, 6, min_step=1.0)[1] == ["0", "1", "2", "3"]


@given(finite, finite, st.integers(min_value=3, max_value=8), st.sampled_from([0.0, 1.0, 10.0]))
def test_a_smallest_step_still_covers_the_data_within_the_count(low, high, most, min_step):
    ticks, labels = nice_ticks(low, high, most, min_step=min_step)
    low, high = min(low, high), max(low, high)
    assert 1 <= len(ticks) <= most and len(set(labels)) == len(labels)
    assert ticks[0] <= low + 1e-9 * max(1.0, abs(low)) and ticks[-1] >= high - 1e-9 * max(1.0, abs(high))
    if len(ticks) > 1:
        assert ticks[1] - ticks[0] >= min_step * (1 - 1e-9)
