"""The benchmark command itself works: on tiny sizes it prints its table and writes its JSON.

Timings are not asserted (they mean nothing at ``--quick`` sizes, and the
machine is shared); the shape of the output is: one or more rows per
benchmark run, every row with the report's keys, and nothing for a
benchmark that was not asked for.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

from tests.conftest import REPO_ROOT

# The benchmarks that finish in seconds at --quick sizes; the ones that
# train (overhead, key_latency, pipeline) take a minute or more even tiny,
# because every training run traces its functions first.
SMOKED = ("first_frame", "matmul", "history")
ROW_KEYS = {
    "benchmark",
    "figure",
    "value",
    "unit",
    "baseline_name",
    "baseline",
    "ratio",
    "target",
    "met",
    "samples",
    "notes",
}


def test_quick_benchmark_run_prints_the_table_and_writes_rows_for_exactly_the_benchmarks_asked(tmp_path):
    output = tmp_path / "bench.json"
    completed = subprocess.run(
        [sys.executable, "-m", "tests.benchmarks", "--quick", "--only", ",".join(SMOKED), "--json", str(output)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "tpudash benchmarks" in completed.stdout
    payload = json.loads(output.read_text())
    assert {"machine", "time", "results"} <= payload.keys()
    assert payload["machine"]["cores"] >= 1 and payload["machine"]["tensorflow"]
    rows = payload["results"]
    assert {row["benchmark"] for row in rows} == set(SMOKED)
    for row in rows:
        assert ROW_KEYS <= row.keys(), row
        assert isinstance(row["value"], float) and math.isfinite(row["value"]), row
        # A row with a target says whether it was met (yes/no in the table); only a row without one has no verdict.
        if row["target"]:
            assert isinstance(row["met"], bool), row
        else:
            assert row["met"] is None, row
        if row["baseline"] is not None:
            assert row["ratio"] is not None and row["target"], row
