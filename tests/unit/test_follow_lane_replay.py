"""A session run's events are folded into its model once, whichever the lane hears of first: the end on disk or
the engine's word.

Issue 26, 5.3: a gradient-descent loss plot once showed a straight line from (0, 17) back to (20, 0), as if the
series were drawn twice. The lane read the run's end from its events.jsonl on a tick and closed the file; the
engine's ``JobFinished`` then arrived and the lane read the run "once more", which reopened the file at its start
and folded every event in again. The interleaving is forced here: the end is read before the engine says so.
"""

from __future__ import annotations

from jobs.events import Metric, Progress, RunFinished, RunStarted
from tests.unit.test_lane import DESCRIPTION, STEPS, ScriptedEngine
from tpudash.engine.lane import Lane, LaneObserver
from tpudash.engine.protocol import JobFinished, JobStarted, RuntimeReady

STEPS_RUN = 21  # gradient descent's default: the start and 20 steps


def test_the_engine_saying_finished_after_the_end_was_read_does_not_fold_the_run_in_twice(store):
    engines: list[ScriptedEngine] = []

    def start(listener):
        engines.append(ScriptedEngine(listener))
        return engines[-1]

    lane = Lane(store, start, LaneObserver(), clock=lambda: 1000.0)
    live = lane.launch(STEPS, {"steps": STEPS_RUN, "lr": 0.1})
    engine = engines[0]
    engine.say(RuntimeReady(DESCRIPTION))
    recorder = store.create(live.run_id, live.job, STEPS.as_text(live.params), DESCRIPTION)
    recorder.record(RunStarted(live.run_id, live.job, live.params, DESCRIPTION, 1.0))
    engine.say(JobStarted(live.run_id, str(store.root / live.run_id)))
    for step in range(STEPS_RUN):
        recorder.record(Metric("loss", 17.0 * 0.64**step, step))
        recorder.record(Progress(step, STEPS_RUN - 1, "step"))
    recorder.record(RunFinished("done", {"loss": 17.0 * 0.64**20}))
    lane.poll()  # the tick reads the end first and settles the run
    assert live.settled.is_set()
    engine.say(JobFinished(live.run_id, "done", None))  # then the engine's word arrives
    lane.poll()

    track = live.model.tracks[("loss", "train", "step")]
    xs, _ = track.series.points()
    assert xs == list(range(STEPS_RUN)), "the loss series was folded in more than once"
    assert track.count == STEPS_RUN and live.model.logs_total == 0
