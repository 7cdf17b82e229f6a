"""A process that records a run with ``tpudash.record`` step by step, as its test says (no TensorFlow).

``python -m tests.writer_process NAME`` records into ``$TPUDASH_RUNS_DIR``
and reads commands from standard input, one per line, answering each on
standard output once its effect is on disk, so a test can wait for it:

- ``metric VALUE``: one train ``loss`` point (and a step of progress);
- ``finish STATUS``: end the run as done, failed or cancelled;
- anything else, or end of input: exit without finishing.
"""

from __future__ import annotations

import sys

import tpudash


def main() -> None:
    run = tpudash.record(sys.argv[1], params={"lr": 0.1})
    print(f"started {run.run_id}", flush=True)
    step = 0
    for line in sys.stdin:
        command, _, argument = line.strip().partition(" ")
        if command == "metric":
            run.metric("loss", float(argument), step=step)
            step += 1
            run.progress(step, 10, "step")
            run.flush()
            print(f"metric {step}", flush=True)
        elif command == "finish":
            run.finish(argument)
            print("finished", flush=True)
        else:
            break


if __name__ == "__main__":
    main()
