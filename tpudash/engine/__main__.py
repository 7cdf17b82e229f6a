"""``python -m tpudash.engine``: the engine process, the one process of a session that owns TensorFlow (or JAX).

Its stdout is the control pipe only (a job's prints and a library's progress
bars join its stderr, the session log), the terminal's Ctrl-C is the
dashboard's to handle, it runs at a lower CPU priority than the dashboard,
and it takes the host's engine lock (``tpudash.engine.hostlock``) before
anything imports TensorFlow, detects the runtime once, then serves the
dashboard's commands (``tpudash.engine.server``) until released. An engine
that finds the lock held says who holds it and exits.

It runs on the framework ``Settings.framework`` resolves to
(``tpudash.config.resolve_framework``: ``--framework``,
``TPUDASH_FRAMEWORK``, else TensorFlow where installed, else JAX): on JAX
the runtime is ``tpudash.accel.jaxdetect.detect_jax_runtime``'s mesh, and
its hello and its runtime say so. ``--framework``, ``--tpu`` and
``--cpu-devices`` may be given on its command line (a user's, or a test's);
the dashboard passes its settings as TPUDASH_* variables.

It runs the jobs tpudash ships: ``main`` takes extra jobs only from its
caller (the test suite's ``python -m tests.engine_main``), never from the
environment.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from tpudash.childproc import claim_stdout
from tpudash.engine.hostlock import EngineLock
from tpudash.engine.server import EngineServer, engine_job_specs, lower_priority, serve


def detect_runtime(settings: Any) -> Any:
    """The runtime on the settings' framework: on TensorFlow ``get_runtime(settings)``, and after a failed
    automatic TPU attempt the CPU default; on JAX ``detect_jax_runtime(settings)``.

    The TPU is left alone and the failure becomes the reason the Devices
    screen gives for "why not TPU".
    """
    from tpudash.config import resolve_framework

    if resolve_framework(settings.framework) == "jax":
        from tpudash.accel.jaxdetect import detect_jax_runtime

        return detect_jax_runtime(settings)
    from tpudash.accel import runtime as runtime_module
    from tpudash.accel.startup import TpuFallback

    try:
        return runtime_module.get_runtime(settings)
    except TpuFallback as fallback:
        os.environ[runtime_module.FALLBACK_REASON_VARIABLE] = fallback.reason
        without_tpu = dataclasses.replace(settings, tpu=runtime_module.NO_TPU)
        return runtime_module.get_runtime(without_tpu, reinitialize=True)


ENGINE_FLAGS = ("framework", "tpu", "cpu_devices")
"""The settings the engine's own command line may give (over TPUDASH_* variables)."""


def engine_flags(argv: Sequence[str]) -> dict[str, str | None]:
    """``--framework``, ``--tpu`` and ``--cpu-devices`` from the engine's command line (None: not given)."""
    parser = argparse.ArgumentParser(prog="python -m tpudash.engine", description="tpudash's engine process")
    for name in ENGINE_FLAGS:
        parser.add_argument("--" + name.replace("_", "-"), dest=name)
    return vars(parser.parse_args(list(argv)))


def main(extra_jobs: Iterable[Any] = (), argv: Sequence[str] | None = None) -> int:
    """The engine process: serve the dashboard's commands on stdin, reply on the real stdout.

    ``extra_jobs``: job specs added to the registry (only tests pass any).
    ``argv``: the engine's flags (``ENGINE_FLAGS``; None: this process's command line).
    """
    flags = engine_flags(sys.argv[1:] if argv is None else argv)
    from tpudash.config import Settings, SettingsError, resolve_framework

    try:
        settings = Settings.load(flags)
    except SettingsError as error:
        print(f"tpudash engine: error: {error}", file=sys.stderr)
        return 2
    replies = claim_stdout()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    framework = resolve_framework(settings.framework)
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
            framework=framework,
        ),
    )
    replies.close()
    # TensorFlow's interpreter teardown can take seconds and holds the TPU
    # meanwhile; the records are closed, so leave now.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
