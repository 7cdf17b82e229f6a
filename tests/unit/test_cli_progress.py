"""Headless ``tpudash run``'s live bars: every epoch's steps bar has a running clock and an ETA."""

from __future__ import annotations

import io

from rich.console import Console

from jobs.events import Progress, RunStarted
from tpudash.cli.sinks import ConsoleSink

STEPS_PER_EPOCH = 60
SECONDS_PER_STEP = 0.25  # exact in binary: the clock reads whole seconds where the test looks


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def shown_bars(sink: ConsoleSink) -> list[str]:
    """The live display's lines, as the terminal shows them now."""
    console = Console(file=io.StringIO(), width=160, color_system=None)
    console.print(sink._progress.get_renderable())
    return console.file.getvalue().splitlines()


def test_the_steps_bar_of_every_epoch_has_its_own_running_clock_and_eta():
    clock = FakeClock()
    sink = ConsoleSink(Console(file=io.StringIO(), width=160), clock=clock)
    sink(None, RunStarted("run", "train", {}, {}, clock.now))
    try:
        for epoch in range(1, 4):
            for step in range(1, STEPS_PER_EPOCH + 1):
                clock.now += SECONDS_PER_STEP
                sink(None, Progress(step, STEPS_PER_EPOCH, "step"))
                if epoch == 3 and step == 25:
                    break
            else:
                sink(None, Progress(epoch, 3, "epoch"))
        steps_bar = next(line for line in shown_bars(sink) if line.startswith("steps"))
    finally:
        sink.close()

    *_, count, elapsed, eta = steps_bar.split()
    assert count == "25/60"
    # 24 steps of 0.25 s since epoch 3's first step, not epoch 1's time frozen
    assert elapsed == "0:00:06", steps_bar
    assert eta != "0:00:00", steps_bar  # 35 steps to go
