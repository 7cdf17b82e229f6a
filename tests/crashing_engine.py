"""``python -m tests.crashing_engine``: an engine that dies as a crashed TensorFlow process does.

It writes ``tests/engine_crash_stderr.txt`` to its stderr and kills itself
with SIGSEGV. That file is the real stderr of a Python process that imported
TensorFlow 2.x on a CPU machine, ran an op, and then segfaulted inside a
``train_step`` (with ``-X faulthandler``): absl's and TensorFlow's start-up
lines, twice, then Python's fault report.
"""

from __future__ import annotations

from pathlib import Path

CRASHING_ENGINE = "tests.crashing_engine"
CRASH_STDERR = Path(__file__).with_name("engine_crash_stderr.txt")

if __name__ == "__main__":
    import os
    import resource
    import signal
    import sys

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file left behind
    sys.stderr.write(CRASH_STDERR.read_text(encoding="utf-8"))
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGSEGV)
