"""TensorFlow in the CLI's own process: the one gate through which ``tpudash run`` and ``tpudash devices`` reach it.

The dashboard keeps TensorFlow in its engine child; the headless commands
detect the runtime and run their job in their own process instead. What owns
TensorFlow there lives here, so the CLI imports no runtime module but this
one (an import-linter contract holds it to that):

- ``detect_runtime``: the runtime on the settings' framework
  (``tpudash.config.resolve_framework``: TensorFlow's strategy, or JAX's
  mesh from ``tpudash.accel.jaxdetect``), with the native chatter sent to
  the session log; after a failed automatic TPU attempt on TensorFlow, the
  same command started over on the CPU default.
- ``InProcessJob``: one job run by the engine's ``Runner`` on a thread of
  this process, so the caller's thread stays free for signals.

Nothing here imports TensorFlow or JAX at import time.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

    from jobs.base import JobSpec
    from tpudash.accel.description import Runtime
    from tpudash.accel.nativelog import NativeStderr
    from tpudash.engine.runner import Sink


class RuntimeUnavailable(Exception):
    """The runtime could not be started; the message says why and what to do instead."""


# TensorFlow's native stderr while this process holds it (None: not redirected).
_native_stderr: NativeStderr | None = None


def detect_runtime(settings: Any, restartable: bool) -> Runtime:
    """Detect the runtime with TensorFlow's native chatter sent to the session log.

    ``restartable``: this process runs the real command line, so after a
    failed automatic TPU attempt it starts over on the CPU default (and does
    not return). Otherwise, and for any other failure, ``RuntimeUnavailable``.
    """
    global _native_stderr
    from tpudash.accel.nativelog import NativeStderr, session_log_path
    from tpudash.accel.runtime import get_runtime
    from tpudash.accel.startup import RuntimeSetupError, TpuFallback
    from tpudash.config import resolve_framework

    if _native_stderr is None and os.environ.get("TPUDASH_NATIVE_STDERR") != "terminal" and _stderr_is_fd2():
        _native_stderr = NativeStderr(session_log_path(settings.runs_dir)).start()
    if resolve_framework(settings.framework) == "jax":
        return _detect_jax(settings)
    try:
        return get_runtime(settings)
    except TpuFallback as fallback:
        if restartable:
            _start_over_on_cpu(fallback.reason)
        raise RuntimeUnavailable(f"{fallback.reason}; run again with --tpu none for the CPU default") from None
    except RuntimeSetupError as error:
        raise RuntimeUnavailable(str(error)) from None


_jax_runtime: Runtime | None = None
"""JAX's runtime, once detected: JAX reads its flags and starts its backend once per process."""


def _detect_jax(settings: Any) -> Runtime:
    """JAX's mesh over every device (``tpudash.accel.jaxdetect``); what keeps it from starting, one line."""
    global _jax_runtime
    from tpudash.accel.jaxdetect import detect_jax_runtime
    from tpudash.accel.startup import RuntimeSetupError

    if _jax_runtime is None:
        try:
            _jax_runtime = detect_jax_runtime(settings)
        except RuntimeSetupError as error:
            raise RuntimeUnavailable(str(error)) from None
        except Exception as error:  # noqa: BLE001 - JAX's backends raise their own types; the line names it
            raise RuntimeUnavailable(f"JAX could not start: {type(error).__name__}: {error}") from None
    return _jax_runtime


def _start_over_on_cpu(reason: str) -> None:
    """Replace this process with the same command on the CPU default.

    The failed TPU attempt has started TensorFlow (and may still be stuck in
    libtpu), so this process can no longer split the CPU; nothing has run yet,
    so starting over loses nothing. Only for the real command line.
    """
    from tpudash.accel.runtime import FALLBACK_REASON_VARIABLE, NO_TPU

    print(f"tpudash: {reason}; starting over on the CPU default (--tpu none)", file=sys.stderr)
    release_native_stderr()
    sys.stdout.flush()
    sys.stderr.flush()
    environment = dict(os.environ, TPUDASH_TPU=NO_TPU, **{FALLBACK_REASON_VARIABLE: reason})
    os.execve(sys.executable, [sys.executable, "-m", "tpudash", *sys.argv[1:]], environment)


def _stderr_is_fd2() -> bool:
    """Only a real process stderr is worth protecting (not a test's capture)."""
    try:
        return sys.stderr.fileno() == 2
    except (AttributeError, OSError, ValueError):
        return False


def native_log_path() -> Path | None:
    """Where TensorFlow's native log for this session goes, while it is redirected."""
    return None if _native_stderr is None else _native_stderr.log_path


def release_native_stderr() -> None:
    """Give file descriptor 2 back to the terminal (nothing to do when it was never taken)."""
    global _native_stderr
    if _native_stderr is not None:
        _native_stderr.stop()
        _native_stderr = None


class InProcessJob:
    """One job run with the engine's ``Runner`` on a thread of this process, recorded in ``runs_dir``.

    ``cancel`` may be called from any thread (a signal handler, a sink whose
    output went away); the job stops at its next step and is recorded as
    cancelled.
    """

    def __init__(
        self,
        spec: JobSpec,
        params: dict,
        runtime: Runtime | None,
        settings: Any,
        runs_dir: Path | str,
        sinks: Iterable[Sink],
        name: str | None = None,
        run_id: str | None = None,
    ):
        """``runtime`` None: the run is launched on workers that detect their own; ``run_id``: record into it."""
        from tpudash.engine.runner import Runner
        from tpudash.runs.store import RunStore

        self._runner = Runner(lambda: runtime, RunStore(runs_dir), settings, sinks=sinks)
        self._queued = self._runner.submit(spec, params, run_id=run_id, name=name)
        self._thread = threading.Thread(
            target=self._runner.execute, args=(self._queued,), name=f"tpudash-job-{spec.name}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def cancel(self) -> None:
        self._runner.cancel(self._queued)

    def wait(self, timeout: float) -> bool:
        """Whether the job has ended, waiting at most ``timeout`` seconds."""
        return self._queued.done_event.wait(timeout)

    @property
    def state(self) -> str:
        """queued, running, done, failed or cancelled."""
        return self._queued.state

    @property
    def run_id(self) -> str:
        return self._queued.run_id

    @property
    def write_error(self) -> OSError | None:
        """Why the run's record could not be written (a full disk); the run then ended as failed."""
        return self._queued.write_error
