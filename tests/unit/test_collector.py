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


HOLD_AND_LET_GO = """
import gc, json
from tpudash.tui import collector
seen = {}
collector.hold()
seen["held"] = gc.isenabled()
collector.let_go(held_for=collector.HOLD_SECONDS_AT_MOST)  # the UI's tick, right after the key: too early
seen["young_hold_kept"] = gc.isenabled()
collector.let_go()  # the frame
seen["after_the_frame"] = gc.isenabled()
collector.let_go()
seen["twice"] = gc.isenabled()
gc.disable()  # someone else's (Textual pauses it while scrolling)
collector.hold()
collector.let_go()
seen["theirs_kept"] = gc.isenabled()
gc.enable()
collector.hold()
collector.release()  # the app ended before the frame
seen["released"] = gc.isenabled()
print(json.dumps(seen))
"""


def test_a_hold_stops_collections_until_let_go_and_never_enables_what_someone_else_disabled():
    result = subprocess.run(
        [sys.executable, "-c", HOLD_AND_LET_GO], capture_output=True, text=True, cwd=REPO_ROOT, timeout=60
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.splitlines()[-1]) == {
        "held": False,
        "young_hold_kept": False,
        "after_the_frame": True,
        "twice": True,
        "theirs_kept": False,
        "released": True,
    }
