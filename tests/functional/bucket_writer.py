"""One of two processes writing one run in a store, as each host of a multi-host training does.

``python -m tests.functional.bucket_writer URL RUN_ID METRIC COUNT`` records
COUNT points of METRIC (steps 0 to COUNT-1) into the run RUN_ID of the runs
directory URL, beside any other writer of that run, closing a segment every
``SEGMENT_STEPS`` steps so that both writers' segments go up while the other
writes. It then closes its part (without finishing the run) and prints
``wrote COUNT`` once the store has all of it, or ``kept in DIR`` if not.
"""

from __future__ import annotations

import sys

from jobs.events import Metric
from tpudash.runs.store import RunStore

SEGMENT_STEPS = 10


def main() -> None:
    url, run_id, metric, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    recorder = RunStore(url).create(run_id, "two-writers", {}, {})
    for step in range(count):
        recorder.record(Metric(metric, 1.0 / (step + 1), step))
        if step % SEGMENT_STEPS == SEGMENT_STEPS - 1:
            recorder.flush()  # closes a segment now: each writer leaves several, numbered 1, 2, …
    recorder.close()
    kept = getattr(recorder, "kept_locally", None)
    print(f"kept in {kept}" if kept is not None else f"wrote {count}", flush=True)


if __name__ == "__main__":
    main()
