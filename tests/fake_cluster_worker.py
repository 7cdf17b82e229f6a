"""A stand-in for ``python -m tpudash`` as a cluster worker, without TensorFlow: the launcher's tests run it.

It takes the command line the launcher gives every worker (``run JOB
--worker-index I --cluster … --run-id ID --json --set …``). Worker 0 creates
the run in ``TPUDASH_RUNS_DIR`` and prints its events as ``tpudash run --json``
does; the others only live. ``FAKE_CLUSTER_MODE`` says what they do:
``done`` (the chief ends the run done; everyone exits 0), ``wait`` (until
SIGTERM, which the chief records as a cancel, as ``tpudash run`` does),
``fail`` (worker 1 says why on stderr and exits 1 once the chief has started).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from jobs.events import Progress, RunFinished, RunStarted, event_to_dict
from tpudash.runs.store import RunStore


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("command")
    parser.add_argument("job")
    parser.add_argument("--worker-index", type=int, required=True)
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--name")
    parser.add_argument("--set", action="append", default=[])
    args = parser.parse_args()
    mode = os.environ.get("FAKE_CLUSTER_MODE", "done")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    print(f"worker {args.worker_index} of {args.cluster} starting", file=sys.stderr, flush=True)
    runs_dir = Path(os.environ["TPUDASH_RUNS_DIR"])
    if args.worker_index != 0:
        if mode == "fail":
            chief_started = runs_dir / args.run_id / "run.json"
            deadline = time.monotonic() + 30
            while not chief_started.exists() and time.monotonic() < deadline:
                stop.wait(0.05)  # another process's file: looked for, as any reader of the runs dir does
            print("RuntimeError: collective ops failed on this worker", file=sys.stderr, flush=True)
            return 1
        if mode == "wait":
            stop.wait(60)
            return 130
        return 0
    recorder = RunStore(runs_dir).create(args.run_id, args.job, {"set": args.set}, {}, name=args.name)

    def say(event) -> None:
        stamp = time.time()
        recorder.record(event, stamp)
        print(json.dumps(event_to_dict(event, stamp)), flush=True)

    say(RunStarted(args.run_id, args.job, {"set": args.set}, {}, time.time()))
    say(Progress(1, 3, "steps"))
    if mode == "done":
        say(Progress(3, 3, "steps"))
        say(RunFinished(status="done", summary={"steps": 3}))
        recorder.close()
        return 0
    stop.wait(60)
    say(RunFinished(status="cancelled"))
    recorder.close()
    return 130


if __name__ == "__main__":
    raise SystemExit(main())
