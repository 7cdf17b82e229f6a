"""``python -m tpudash.engine``: the engine process, the one process of a session that owns TensorFlow.

Its stdout is the control pipe only (a job's prints and a library's progress
bars join its stderr, the session log), the terminal's Ctrl-C is the
dashboard's to handle, it runs at a lower CPU priority than the dashboard,
and it takes the host's engine lock (``tpudash.engine.hostlock``) before
anything imports TensorFlow, detects the runtime once, then serves the
dashboard's commands (``tpudash.engine.server``) until released. An engine
that finds the lock held says who holds it and exits.

It runs the jobs tpudash ships: ``main`` takes extra jobs only from its
caller (the test suite's ``python -m tests.engine_main``), never from the
environment.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
from collections.abc import Iterable
from typing import Any

from tpudash.childproc import claim_stdout
from tpudash.engine.hostlock import EngineLock
from tpudash.engine.server import EngineServer, engine_job_specs, lower_priority, serve


def detect_runtime(settings: Any) -> Any:
    """``get_runtime(settings)``; after a failed automatic TPU attempt, the CPU default.

    The TPU is left alone and the failure becomes the reason the Devices
    screen gives for "why not TPU".
    """
    from tpudash.accel import runtime as runtime_module
    from tpudash.accel.startup import TpuFallback

    try:
        return runtime_module.get_runtime(settings)
    except TpuFallback as fallback:
        os.environ[runtime_module.FALLBACK_REASON_VARIABLE] = fallback.reason
        without_tpu = dataclasses.replace(settings, tpu=runtime_module.NO_TPU)
        return runtime_module.get_runtime(without_tpu, reinitialize=True)


def main(extra_jobs: Iterable[Any] = ()) -> int:
    """The engine process: serve the dashboard's commands on stdin, reply on the real stdout.

    ``extra_jobs``: job specs added to the registry (only tests pass any).
    """
    replies = claim_stdout()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    from tpudash.config import Settings

    settings = Settings.load()
    lower_priority(settings.engine_nice)
    specs = engine_job_specs(extra_jobs)
    dashboard = os.getppid()
    serve(
        sys.stdin,
        replies,
        lambda send: EngineServer(
            send,
            settings,
            specs,
            lambda: detect_runtime(settings),
            host_lock=EngineLock(),
            dashboard_pid=dashboard,
        ),
    )
    replies.close()
    # TensorFlow's interpreter teardown can take seconds and holds the TPU
    # meanwhile; the records are closed, so leave now.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
