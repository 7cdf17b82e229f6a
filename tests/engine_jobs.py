"""Jobs that exist only in tests, for the engine process the tests start (``python -m tests.engine_main``).

``test-abort`` ends its process the way a native crash does (SIGABRT after a
line on stderr, like a failed CHECK in TensorFlow's C++), to show that the
engine may die and the dashboard stays up. ``test-devices`` runs on either
framework and reports which, and how many devices its runtime has: a
launch that reached the engine, whatever the shipped jobs can do yet.
"""

from __future__ import annotations

import os
import sys

from jobs.base import JobSpec

ABORT_LINE = "F0000 tpudash test job: aborting on purpose (a native CHECK failure)"


def abort_process(ctx, params):
    ctx.log("about to abort the engine process")
    print(ABORT_LINE, file=sys.stderr, flush=True)
    os.abort()


def count_devices(ctx, params):
    framework = getattr(ctx.runtime, "framework", "tensorflow")
    ctx.log(f"{len(ctx.runtime.logical_devices)} devices on {framework}")
    return {"framework": framework, "devices": len(ctx.runtime.logical_devices)}


SPECS = (
    JobSpec(
        name="test-devices",
        title="Test devices",
        description="Counts the runtime's devices on either framework (tests only).",
        params=(),
        run=count_devices,
        run_jax=count_devices,
    ),
    JobSpec(
        name="test-abort",
        title="Test abort",
        description="Aborts the process that runs it (tests only).",
        params=(),
        run=abort_process,
    ),
)
