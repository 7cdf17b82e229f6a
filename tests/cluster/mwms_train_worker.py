"""One worker of a MultiWorkerMirroredStrategy cluster, started directly with TF_CONFIG (no launcher): the train job's code.

``python -m tests.cluster.mwms_train_worker OUT_DIR [NAME=VALUE ...]`` detects the
runtime from this process's TF_CONFIG (``tpudash.accel.runtime.detect``) and
runs the train job with those params. Every event goes to
``OUT_DIR/events-<worker>.jsonl`` and to standard output as it happens (a
test waits on the output), and the outcome to ``OUT_DIR/outcome-<worker>.json``: the summary,
or the error with its type, with the times it started and ended; and the
run id the workers agreed on (each proposes its own; the chief's must win).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

from jobs import get_job
from jobs.base import JobContext
from tpudash.accel.multiworker import agree_on_run_id
from tpudash.accel.runtime import detect, keep_libtpu_unloaded


def main(argv: list[str]) -> int:
    out_dir = Path(argv[0])
    assignments = dict(item.split("=", 1) for item in argv[1:])
    keep_libtpu_unloaded(os.environ)
    runtime = detect(tpu="none")
    worker = runtime.description.cluster["worker"] if runtime.description.cluster else 0
    events = (out_dir / f"events-{worker}.jsonl").open("w", encoding="utf-8")

    def emit(event) -> None:
        payload = {"type": type(event).__name__, "time": time.time(), **asdict(event)}
        line = json.dumps(payload, default=str) + "\n"
        events.write(line)
        events.flush()
        sys.stdout.write(line)  # as it happens: a test waits on a worker's own output
        sys.stdout.flush()

    spec = get_job("train")
    params = spec.resolve(assignments)
    run_dir = out_dir / f"run-{worker}"
    run_dir.mkdir(parents=True, exist_ok=True)
    ctx = JobContext(runtime=runtime, emit=emit, run_dir=run_dir, settings=SimpleNamespace(data_dir=None))
    started = time.time()
    outcome: dict = {"worker": worker, "description": runtime.description.to_dict(), "started": started}
    # Each worker proposes its own id; all must come back with the chief's.
    outcome["agreed_run_id"] = agree_on_run_id(runtime.strategy, f"run-proposed-by-worker-{worker}")
    try:
        summary = spec.run(ctx, params)
        outcome.update(status="done", summary=summary)
    except Exception as error:  # noqa: BLE001 - the outcome is the test's to judge
        outcome.update(
            status="failed", error=str(error), error_type=type(error).__name__, traceback=traceback.format_exc()
        )
    outcome["ended"] = time.time()
    (out_dir / f"outcome-{worker}.json").write_text(json.dumps(outcome, default=str), encoding="utf-8")
    events.close()
    return 0 if outcome["status"] == "done" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
