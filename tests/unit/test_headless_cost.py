"""The headless-cost benchmark: its switch turns off exactly tpudash's per-step work, and its reading of the steps."""

from __future__ import annotations

import threading

import pytest

from tests.benchmarks.bench_headless_cost import (
    PARTS,
    StepStart,
    Switch,
    do_nothing,
    periods_from_switches,
    process_cores,
    step_intervals,
    switchable,
)
from tests.benchmarks.bench_watch_cost import Period


def test_a_step_lasts_until_the_next_start_in_its_epoch_and_an_epochs_last_step_is_left_out():
    starts = [StepStart(0, 0, 1.0), StepStart(0, 1, 1.1), StepStart(0, 2, 1.3), StepStart(1, 0, 5.0)]
    starts += [StepStart(1, 1, 5.2), StepStart(1, 3, 5.6)]  # a step the clock missed: no step spans it
    assert step_intervals(starts) == pytest.approx([(1.0, 1.1), (1.1, 1.3), (5.0, 5.2)])


def test_each_period_lasts_until_the_next_one_starts_and_the_last_until_the_end():
    periods = periods_from_switches([(10.0, False, 0), (11.0, True, 0), (12.0, True, 1), (13.5, False, 1)], 14.0)
    assert periods == [
        Period(10.0, 11.0, watched=False, pair=0),
        Period(11.0, 12.0, watched=True, pair=0),
        Period(12.0, 13.5, watched=True, pair=1),
        Period(13.5, 14.0, watched=False, pair=1),
    ]


def test_the_process_cores_of_each_state_add_its_periods_cpu_over_their_wall_time():
    periods = periods_from_switches([(0.0, True, 0), (1.0, False, 0), (2.0, True, 1), (4.0, False, 1)], 5.0)
    # CPU seconds at each switch: 1.5 in the first on period, 1.0 off, 3.0 in the second on period.
    assert process_cores(periods, [0.0, 1.5, 2.5, 5.5]) == {True: pytest.approx(1.5), False: pytest.approx(1.0)}


class Redrawing:
    def refresh(self) -> str:
        return "drawn"


class Sampling:
    def _sample_once(self) -> str:
        return "sampled"


def test_what_is_asked_applies_at_the_next_step_start_and_off_quiets_the_display_and_telemetry():
    switch = Switch()
    switch.live, switch.sampling = Redrawing(), Sampling()
    switch.ask(False, pair=0)
    assert switch.on, "nothing changes between two step starts"
    switch.at_step_start(10.0)
    assert not switch.on
    assert switch.live.refresh is do_nothing and switch.sampling._sample_once is do_nothing
    switch.at_step_start(10.1)
    switch.ask(False, pair=1)  # the next pair starts in the same state: a new period, nothing switched
    switch.at_step_start(10.2)
    switch.ask(True, pair=1)
    switch.at_step_start(10.3)
    assert switch.on
    assert switch.live.refresh() == "drawn" and switch.sampling._sample_once() == "sampled"
    assert switch.switches == [(10.0, False, 0), (10.2, False, 1), (10.3, True, 1)]
    assert len(switch.cpu_at_switch) == 3


def test_a_part_left_out_of_the_switch_runs_in_both_states():
    switch = Switch(parts=("display",))
    switch.live, switch.sampling = Redrawing(), Sampling()
    switch.ask(False, pair=0)
    switch.at_step_start(1.0)
    assert not switch.on
    assert switch.live.refresh is do_nothing
    assert switch.sampling._sample_once() == "sampled"


class Reporter:
    """What the job's callback reports to: which steps it was told of."""

    def __init__(self) -> None:
        self.plan = type("Plan", (), {"steps_per_execution": 1})()
        self.begun: list[int] = []
        self.ended: list[int] = []

    def begin_epoch(self, epoch: int) -> None:
        pass

    def before_execution(self, steps: int) -> None:
        self.begun.append(steps)

    def after_execution(self, steps_done: int, loss: float | None, accuracy: float | None) -> None:
        self.ended.append(steps_done)

    def end_training_part(self) -> None:
        pass

    def end_epoch(self, train: dict, val: dict | None) -> None:
        pass


class Context:
    def cancelled(self) -> bool:
        return False


@pytest.mark.parametrize(
    ("parts", "steps_reported"),
    [
        # Epoch 1: steps 1–3 off, then on; epoch 2 on throughout.
        (PARTS, [4, 5, 6, 1, 2, 3, 4, 5, 6]),
        # The hooks left out of the switch: every step is reported, off or on.
        (("display", "telemetry"), [1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6]),
    ],
    ids=["every part", "all but the hooks"],
)
def test_off_skips_the_jobs_step_hooks_from_the_next_step_and_every_step_start_is_stamped(parts, steps_reported):
    import keras
    import numpy as np
    from keras.src.callbacks.callback_list import CallbackList

    from jobs.trainreport import reporting_callback

    keras_list_init = CallbackList.__init__

    switch, starts = Switch(parts), []
    reporter = Reporter()

    class TurnOnAfterThirdStep(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2 and not switch.on:
                switch.ask(True, pair=0)

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    data = np.zeros((48, 4), "float32"), np.zeros((48, 2), "float32")
    switch.ask(False, pair=0)
    with switchable(switch, starts, threading.Event()) as (step_hooks, _):
        callbacks = [reporting_callback(keras, Context(), reporter, lambda split: {}), TurnOnAfterThirdStep()]
        model.fit(*data, batch_size=8, epochs=2, callbacks=callbacks, verbose=0, shuffle=False)
    assert reporter.ended == steps_reported
    assert len(reporter.begun) == len(steps_reported)
    assert len(step_hooks.seconds) == 2 * len(steps_reported), "the hooks' time is counted only while they run"
    assert [(start.epoch, start.batch) for start in starts] == [
        (epoch, batch) for epoch in (0, 1) for batch in range(6)
    ]
    assert [on for _, on, _ in switch.switches] == [False, True]
    assert CallbackList.__init__ is keras_list_init, "the patches are gone with the block"
