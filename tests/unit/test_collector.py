"""The dashboard's own process keeps its collector out of the way of keys once settled, and gives it back at its end.

Each check runs in a process of its own: freezing and the thresholds are the
whole process's, and the test process makes app after app.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO_ROOT

SETTLE_AND_RELEASE = """
import gc, json
from tpudash.tui import collector
before = gc.get_threshold()
collector.settle()
settled = {"frozen": gc.get_freeze_count(), "thresholds": gc.get_threshold()}
collector.settle()  # the app settles once, but a second call must not lose the thresholds from before
collector.release()
print(json.dumps({"before": before, "settled": settled, "after": gc.get_threshold(), "frozen_after": gc.get_freeze_count()}))
"""


def test_settling_freezes_the_heap_and_makes_full_collections_rare_and_release_gives_both_back():
    result = subprocess.run(
        [sys.executable, "-c", SETTLE_AND_RELEASE], capture_output=True, text=True, cwd=REPO_ROOT, timeout=60
    )
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.splitlines()[-1])
    before, settled = tuple(seen["before"]), seen["settled"]
    assert settled["frozen"] > 0, "nothing was frozen"
    young, middle, full = settled["thresholds"]
    # A full collection comes after young × middle × full allocations: at least ten times rarer than before.
    assert young * middle * full >= 10 * before[0] * before[1] * before[2]
    assert young <= 10_000, "a young collection so rare would walk a long nursery in one go"
    assert tuple(seen["after"]) == before
    assert seen["frozen_after"] == 0
