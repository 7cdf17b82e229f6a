"""A whole dashboard session in a fresh process, to show that it never imports TensorFlow.

``python -m tests.functional.tf_free_session`` opens Devices, runs every
job once with small params through the engine process, cancels one, and
prints one JSON line: the statuses, the engine's pid, and whether tensorflow
or keras ever reached this process's ``sys.modules``. The pytest process
cannot answer that question itself: its fixtures import TensorFlow.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

SMALL_PARAMS = {
    "matmul": {"m": "64", "k": "64", "n": "64", "repeats": "1"},
    "replica-matmul": {},
    "replica-dataset": {},
    "all-reduce": {"size_mb": "0.5", "repeats": "2", "warmup": "1"},
    "gradient-descent": {},
    "train": {"source": "synthetic", "epochs": "1", "batch_per_replica": "8", "limit_train": "256", "limit_test": "64"},
    "dtensor-mlp": {
        "source": "synthetic",
        "hidden": "32,16",
        "epochs": "1",
        "batch_size": "64",
        "limit_train": "256",
        "limit_test": "64",
    },
}
CANCELLED_TRAIN = {
    "source": "synthetic",
    "epochs": "50",
    "batch_per_replica": "8",
    "limit_train": "2048",
    "limit_test": "64",
}
TIMEOUT = 300.0


async def session() -> dict:
    from tpudash.config import Settings
    from tpudash.tui.app import TpudashApp

    app = TpudashApp(Settings.load())
    statuses: dict[str, str] = {}
    async with app.run_test(size=(120, 40)) as pilot:
        await asyncio.wait_for(app.runtime_settled.wait(), TIMEOUT)
        await pilot.press("d")
        for name in app.session.job_specs:
            live = app.session.launch_by_name(name, SMALL_PARAMS.get(name, {}))
            await asyncio.wait_for(live.settled.wait(), TIMEOUT)
            statuses[name] = (
                live.model.status if live.model.status == "done" else f"{live.model.status}: {live.model.error}"
            )
        cancelled = app.session.launch_by_name("train", CANCELLED_TRAIN)
        while "step" not in cancelled.model.progress:
            await asyncio.wait_for(app.next_tick(), TIMEOUT)
        await pilot.press("c")
        await asyncio.wait_for(cancelled.settled.wait(), TIMEOUT)
        statuses["train (cancelled mid-run)"] = cancelled.model.status
        engine_pid = app.session.lane.engine.pid
        engine_starts = app.session.lane.engine_starts
    return {
        "statuses": statuses,
        "engine_pid": engine_pid,
        "engine_starts": engine_starts,
        "pid": os.getpid(),
        "tensorflow": "tensorflow" in sys.modules,
        "keras": "keras" in sys.modules,
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(session())))
