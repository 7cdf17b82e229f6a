"""Stages: what a run does before its steps report progress, in the run view's model and in `tpudash run`.

The events carry fixed times, so the lines are checked to the tenth of a second.
"""

from __future__ import annotations

import io

from rich.console import Console

from jobs.events import RunFinished, RunStarted, Stage, StageAnnouncer, dumps, loads
from tpudash.cli.sinks import ConsoleSink
from tpudash.runs.model import RunModel

DATA = "making synthetic MNIST-shaped data"


def model_at(events):
    model = RunModel()
    model.apply(RunStarted("run", "train", {}, {}, 100.0), 100.0)
    for stamp, event in events:
        model.apply(event, stamp)
    return model


def test_a_stage_round_trips_through_json():
    assert loads(dumps(Stage(DATA, 4096, 70_000))) == Stage(DATA, 4096, 70_000)


def test_while_preparing_the_line_says_what_runs_now_with_its_count_and_time():
    model = model_at([(100.0, Stage(DATA)), (100.3, Stage(DATA, 4096, 70_000))])
    assert model.stage_line(now=101.0) == f"preparing: {DATA} 4,096/70,000 · 1.0s"
    model.apply(Stage("building the model"), 101.5)
    assert model.stage_line(now=102.0) == f"preparing: building the model · 0.5s  ({DATA} 1.5s)"


def test_once_training_the_line_says_how_long_getting_ready_took_and_where_it_went():
    model = model_at(
        [
            (100.0, Stage(DATA)),
            (101.5, Stage("building the model")),
            (104.0, Stage("tracing and running the first step")),
            (109.5, Stage("training")),
        ]
    )
    ready = f"ready in 9.5s: {DATA} 1.5s · building the model 2.5s · tracing and running the first step 5.5s"
    assert model.stage_line(now=111.0) == ready
    model.apply(Stage("evaluating on the test split"), 120.0)
    assert model.stage_line(now=123.0) == f"evaluating on the test split · 3.0s   ({ready})"
    model.apply(RunFinished("done"), 125.0)
    assert model.stage_line(now=500.0) == ready


def test_a_run_that_ends_while_preparing_says_so_with_every_stage_timed():
    model = model_at([(100.0, Stage(DATA)), (101.5, Stage("building the model")), (102.0, RunFinished("cancelled"))])
    assert model.stage_line(now=900.0) == f"ended while preparing: {DATA} 1.5s · building the model 0.5s"


def test_a_run_without_stages_has_no_stage_line():
    assert model_at([]).stage_line(now=101.0) is None


def test_a_job_announces_each_stage_once_and_its_counts_at_a_bounded_rate():
    sent = []
    stage = StageAnnouncer(sent.append)
    stage(DATA)
    stage(DATA)
    for done in range(1, 1001):
        stage(DATA, done, 1000)
    stage("building the model")
    counts = [event.done for event in sent if event.name == DATA]
    # The announcement and the last count always; between them at most 4 a second.
    assert counts[0] is None and counts[-1] == 1000 and len(counts) <= 6
    assert sent[-1] == Stage("building the model") and stage.current == "building the model"


def test_tpudash_run_prints_the_preparation_breakdown_once_training_begins():
    output = io.StringIO()
    sink = ConsoleSink(Console(file=output, width=200, force_terminal=False))
    sink(
        None,
        RunStarted("run", "train", {}, {"kind": "CPU", "strategy": "MirroredStrategy", "num_replicas": 8}, 100.0),
        100.0,
    )
    for stamp, event in [
        (100.0, Stage(DATA)),
        (100.2, Stage(DATA, 70_000, 70_000)),
        (101.5, Stage("building the model")),
        (104.0, Stage("tracing and running the first step")),
        (109.5, Stage("training")),
        (111.0, Stage("evaluating on the test split")),
        (112.0, Stage("training")),
    ]:
        sink(None, event, stamp)
    sink(None, RunFinished("done"), 113.0)
    text = output.getvalue()
    ready = f"ready in 9.5s: {DATA} 1.5s · building the model 2.5s · tracing and running the first step 5.5s"
    assert text.count(ready) == 1


def live_display(sink: ConsoleSink) -> str:
    """What `tpudash run`'s live area (its rich Progress) shows now."""
    screen = Console(file=io.StringIO(), width=160)
    screen.print(sink._progress.get_renderable())
    return screen.file.getvalue()


def test_tpudash_run_shows_the_stage_under_way_with_its_count_and_clock():
    sink = ConsoleSink(Console(file=io.StringIO(), width=160, force_terminal=False))
    sink(
        None,
        RunStarted("run", "train", {}, {"kind": "CPU", "strategy": "MirroredStrategy", "num_replicas": 8}, 100.0),
        100.0,
    )
    sink(None, Stage(DATA), 100.0)
    sink(None, Stage(DATA, 4096, 70_000), 100.3)
    shown = live_display(sink)
    assert DATA in shown and "4096/70000" in shown and "0:00:00" in shown
    sink(None, Stage("building the model"), 101.5)
    shown = live_display(sink)
    # One line for the stage under way; a stage that counts nothing shows no count.
    assert "building the model" in shown and DATA not in shown and "/?" not in shown
    sink.close()
