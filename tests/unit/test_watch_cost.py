"""The watch-cost benchmark's reading of one training: steps, the periods they fell in, and the ratio per pair."""

from __future__ import annotations

import pytest

from tests.benchmarks.bench_watch_cost import Period, frozen_over_watched, period_means, step_intervals


def step_events(stamps_by_epoch: list[list[float]]) -> list[dict]:
    """Per-step progress events as the train job writes them, an epoch's count starting at 1, with other events between."""
    events: list[dict] = []
    for epoch, stamps in enumerate(stamps_by_epoch, start=1):
        for done, stamp in enumerate(stamps, start=1):
            events.append({"type": "metric", "name": "batch_loss", "value": 1.0, "t": stamp})
            events.append({"type": "progress", "unit": "step", "done": done, "total": len(stamps), "t": stamp})
        events.append({"type": "progress", "unit": "epoch", "done": epoch, "t": stamps[-1] + 0.5})
    return events


def test_steps_are_the_time_between_progress_events_leaving_out_each_epochs_first():
    steps = step_intervals(step_events([[1.0, 1.1, 1.3], [5.0, 5.2]]))
    # 5.0 - 1.3 spans the first epoch's validation: not a step.
    assert steps == pytest.approx([(1.0, 1.1), (1.1, 1.3), (5.0, 5.2)])


def test_a_pair_compares_only_steps_wholly_inside_its_periods():
    # Steps of 0.1 s while frozen and 0.125 s while watched; one step spans the change of state.
    frozen = [(10 + 0.1 * i, 10 + 0.1 * (i + 1)) for i in range(10)]  # 10.0 … 11.0
    spanning = [(11.0, 11.3)]
    watched = [(11.3 + 0.125 * i, 11.3 + 0.125 * (i + 1)) for i in range(8)]  # 11.3 … 12.3
    periods = [Period(10.0, 11.1, watched=False, pair=0), Period(11.1, 12.3, watched=True, pair=0)]
    means = period_means(periods, frozen + spanning + watched)
    assert means[0][False] == pytest.approx(0.1)
    assert means[0][True] == pytest.approx(0.125)
    assert frozen_over_watched(means) == pytest.approx([0.8])


def test_a_period_with_too_few_steps_leaves_its_pair_out():
    steps = [(0.1 * i, 0.1 * (i + 1)) for i in range(30)]
    periods = [
        Period(0.0, 1.0, watched=True, pair=0),
        Period(1.0, 2.0, watched=False, pair=0),
        Period(2.0, 2.25, watched=False, pair=1),  # two steps: a stall, or the training's end
        Period(2.25, 3.0, watched=True, pair=1),
    ]
    assert frozen_over_watched(period_means(periods, steps)) == pytest.approx([1.0])
