"""A runs directory holding a good run beside every hostile case issue 25 reproduced.

Used by the History test (tests/functional/test_app_history.py) and, as
``python -m tests.crafted_runs DIR``, to fill a directory for a look in a
real terminal (``TPUDASH_RUNS_DIR=DIR tpudash``, then h).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

# Each crafted run: its directory name, and what the run's detail says is wrong with it.
GOOD = "20261125-100000-train-good00"
CRAFTED = {
    "20261125-100001-train-badtim": "metric event: t must be a unix time",
    "20261125-100002-train-badstp": "metric event: step must be a whole number",
    "20261125-100003-matmul-badtbl": "table event: columns must be a list",
    "20261125-100004-train-st1e300": "run.json: started must be a unix time",
    "20261125-100005-train-stinf0": "run.json: started must be a unix time (1970 to 9999), not inf",
    "20261125-100006-train-pidbig": "run.json: pid must be a process id",
    "20261125-100007-train-pidneg": "run.json: pid must be a process id",
    "20261125-100008-train-pidzro": "run.json: pid must be a process id",
    "20261125-100009-train-fifo00": "run.json: not a regular file (a FIFO)",
    "20261125-100010-train-devzer": "events.jsonl: a symbolic link, not followed",
    "20261125-100011-train-partil": "line 22: truncated or not JSON",
}


def _events(now: float) -> list[dict]:
    started = {"type": "run_started", "t": now - 60, "run_id": "x", "job": "train", "params": {}, "runtime": {}}
    started["time"] = now - 60
    losses = [
        {"type": "metric", "t": now - 60 + step, "name": "loss", "value": 1 / (step + 1), "step": step, "epoch": 0}
        for step in range(20)
    ]
    return [started, *losses, {"type": "run_finished", "t": now - 30, "status": "done", "summary": {}}]


def _write_run(root: Path, name: str, events: list[dict] | str | None, **meta: object) -> Path:
    run_dir = root / name
    run_dir.mkdir(parents=True)
    record = {"run_id": name, "job": name.split("-")[2], "status": "done", "source": "record", "params": {}}
    record.update(started=time.time() - 60, finished=time.time() - 30, pid=1234, host="another-host")
    record.update(meta)
    (run_dir / "run.json").write_text(json.dumps(record), encoding="utf-8")
    if events is not None:
        text = events if isinstance(events, str) else "".join(json.dumps(event) + "\n" for event in events)
        (run_dir / "events.jsonl").write_text(text, encoding="utf-8")
    return run_dir


def craft_runs(root: Path) -> None:
    """Fill ``root`` with GOOD and every CRAFTED run."""
    root.mkdir(parents=True, exist_ok=True)
    now = time.time()
    good = _events(now)
    names = iter(CRAFTED)
    _write_run(root, GOOD, good)
    _write_run(root, next(names), [*good[:5], dict(good[5], t="soon"), *good[6:]])
    _write_run(root, next(names), [*good[:5], dict(good[5], step="one"), *good[6:]])
    table = {"type": "table", "title": "per-device check", "columns": 5, "rows": [[1]]}
    _write_run(root, next(names), [*good[:3], table, *good[3:]])
    _write_run(root, next(names), good, started=1e300)
    infinite = _write_run(root, next(names), good)
    (infinite / "run.json").write_text('{"job": "train", "status": "done", "started": Infinity}', encoding="utf-8")
    here = {"status": "running", "host": socket.gethostname()}
    for pid in (2**70, -1, 0):
        _write_run(root, next(names), good[:-1], pid=pid, **here)
    fifo = root / next(names)
    fifo.mkdir()
    os.mkfifo(fifo / "run.json")
    endless = _write_run(root, next(names), None)
    (endless / "events.jsonl").symlink_to("/dev/zero")
    cut = "".join(json.dumps(event) + "\n" for event in good[:-1]) + '{"type": "metric", "name": "lo'
    _write_run(root, next(names), cut)


if __name__ == "__main__":
    craft_runs(Path(sys.argv[1]))
    print(f"{len(CRAFTED) + 1} runs in {sys.argv[1]}")
