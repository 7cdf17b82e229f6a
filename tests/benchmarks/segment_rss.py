"""Peak memory of listing, opening and exporting a run held in one large segment (issue 37, item 3).

``python -m tests.benchmarks.segment_rss [--events N] [--layout segment|appended]``

Makes a runs directory holding one run whose writer crashed (run.json says
``running``, its lock is free) and whose N events (1M by default: about
100 MB) sit in one segment ``events/<writer>-00000001.jsonl`` (or, with
``--layout appended``, in ``events.jsonl``). Then each of three commands
runs in a fresh process of this checkout's code, which prints its resident
memory after its imports (the baseline) and its peak (VmHWM):

- ``runs``: ``tpudash runs --json`` (the crashed run is folded from its events);
- ``open``: what the dashboard's run view does, ``RunFollower(...).catch_up()``;
- ``export``: ``tpudash export RUN -o FILE`` (CSV).

Run it from a checkout (``cd <checkout> && python -m tests.benchmarks.segment_rss``):
the current directory's code is what is measured, so an older worktree
measures the older code. Not part of the benchmark table: it takes a minute.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# Runs in a fresh interpreter: argv is runs_dir, run_id, what.
CHILD = r"""
import contextlib, json, os, sys

def status(field):
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0

runs_dir, run_id, what = sys.argv[1:4]
from tpudash.cli.main import main
from tpudash.runs.follow import RunFollower
from tpudash.runs.store import RunStore
baseline = status("VmRSS")
with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
    if what == "runs":
        main(["runs", "--json", "--runs-dir", runs_dir])
    elif what == "open":
        follower = RunFollower(RunStore(runs_dir), run_id)
        follower.catch_up()
        assert follower.ended, "the run did not end"
        steps = follower.model.progress["step"].done
    elif what == "export":
        main(["export", run_id, "--runs-dir", runs_dir, "-o", os.devnull])
print(json.dumps({"baseline": baseline, "peak": status("VmHWM")}))
"""

START = 1_790_000_000.0


def make_run(runs_dir: Path, events: int, layout: str) -> str:
    """One crashed run of ``events`` events: a loss, an accuracy and the progress per step, as a long fit writes."""
    from jobs.events import Metric, Progress, RunStarted, dumps
    from tpudash.runs.store import RunStore

    script = (
        "import os, sys\n"
        "from tpudash.runs.store import RunStore\n"
        "recorder = RunStore(sys.argv[1]).create('20261125-000000-train-bigseg', 'train', {}, {})\n"
        "os._exit(0)  # a crash: run.json stays 'running', the lock goes with the process\n"
    )
    subprocess.run([sys.executable, "-c", script, str(runs_dir)], check=True)
    run_id = "20261125-000000-train-bigseg"
    run_dir = RunStore(runs_dir).root / run_id
    (run_dir / "events.jsonl").unlink(missing_ok=True)
    steps = max(1, (events - 1) // 3)
    target = run_dir / "events.jsonl"
    if layout == "segment":
        (run_dir / "events").mkdir(exist_ok=True)
        target = run_dir / "events" / "host-1-abcdef-00000001.jsonl"
    with target.open("w", encoding="utf-8") as out:
        out.write(dumps(RunStarted(run_id, "train", {}, {}, START), START) + "\n")
        for step in range(1, steps + 1):
            stamp = START + step
            out.write(dumps(Metric("loss", 1.0 / step, step, 0), stamp) + "\n")
            out.write(dumps(Metric("accuracy", 1.0 - 1.0 / step, step, 0), stamp) + "\n")
            out.write(dumps(Progress(step, steps, "step"), stamp) + "\n")
    return run_id


def measure(runs_dir: Path, run_id: str, what: str) -> dict[str, int]:
    found = subprocess.run(
        [sys.executable, "-c", CHILD, str(runs_dir), run_id, what],
        check=True,
        capture_output=True,
        text=True,
        cwd=os.getcwd(),
    )
    return json.loads(found.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.segment_rss", description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--layout", choices=("segment", "appended"), default="segment")
    parser.add_argument("--rounds", type=int, default=1, help="measure each command this many times (interleaved)")
    args = parser.parse_args(argv)
    runs_dir = Path(tempfile.mkdtemp(prefix="tpudash-segment-rss-"))
    try:
        run_id = make_run(runs_dir, args.events, args.layout)
        size = sum(path.stat().st_size for path in (runs_dir / run_id).rglob("*.jsonl"))
        print(f"{args.layout}: {args.events:,} events, {size / 1e6:.1f} MB, code of {os.getcwd()}")
        for round_number in range(args.rounds):
            for what in ("runs", "open", "export"):
                found = measure(runs_dir, run_id, what)
                above = found["peak"] - found["baseline"]
                print(
                    f"  {what:<6} baseline {found['baseline'] / 1e6:6.1f} MB  peak {found['peak'] / 1e6:6.1f} MB"
                    f"  above baseline {above / 1e6:6.1f} MB  (round {round_number + 1})",
                    flush=True,
                )
    finally:
        shutil.rmtree(runs_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
