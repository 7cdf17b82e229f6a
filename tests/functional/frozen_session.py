"""A dashboard as its own process runs it (``freeze_after_start``), in a fresh process: what the collector sees.

``python -m tests.functional.frozen_session RUNS_DIR`` starts the app under
Pilot, waits until it has settled in, quits, and prints one JSON line: how
many objects were frozen once it settled in, and how many after its end.
Freezing changes the whole process's collector, so the pytest process,
which makes app after app, never does it itself.
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys

from tests.benchmarks.bench_hosts import make_app
from tests.functional.conftest import press_to_quit


async def main(runs_dir: str) -> dict:
    app = make_app(runs_dir)  # freeze_after_start=True, as tpudash.tui.app.run_app makes it
    async with app.run_test(size=(80, 24)) as pilot:
        await asyncio.wait_for(app.settled_in.wait(), 60)
        settled = gc.get_freeze_count()
        await press_to_quit(pilot, "q")
    return {"frozen_once_settled": settled, "frozen_after_the_end": gc.get_freeze_count()}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1]))), flush=True)
