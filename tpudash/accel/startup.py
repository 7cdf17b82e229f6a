"""Setting up a runtime: the errors it raises, and TensorFlow's start-up steps that can hang, bounded and explained.

libtpu's start-up can block for minutes, and a gRPC connect to an
unreachable TPU never returns. ``call_with_timeout`` bounds such a call and,
when it gives up, says what the native log last said the start-up waited on
(``waited_for``). ``connect_tpu`` is resolver → connect → initialize →
TPUStrategy, each failure a ``RuntimeSetupError`` that names the step. Both
the runtime (``tpudash.accel.runtime``) and the TPU probe's child
(``tpudash.accel.tpuprobe``) use them; TensorFlow is passed in, never
imported here, so what only needs the errors (the engine's loop, the CLI)
imports no TensorFlow through this module.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

from tpudash.accel import nativelog


class RuntimeSetupError(RuntimeError):
    """The requested accelerator could not be set up; the message says why."""


class StartupTimeout(RuntimeSetupError):
    """TensorFlow or the TPU did not answer in time (a thread may still be stuck in it)."""


class TensorFlowMissing(RuntimeSetupError):
    """No TensorFlow is installed; the message carries the install line for this host."""


class TpuFallback(RuntimeSetupError):
    """An automatic TPU attempt failed after TensorFlow started.

    This process can no longer split the CPU into logical devices (TensorFlow's
    runtime is up, a stuck TPU call may still hold it), so the CPU default has
    to start in a fresh process with ``--tpu none``; ``reason`` says why.
    """

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


# Words of TensorFlow's and libtpu's log lines that say what a TPU start-up is
# waiting on; the rest (CUDA probing, CPU features) is noise at that moment.
GLOG_PREFIX = re.compile(r"^(?:\d{4}-\d\d-\d\d [\d:.]+: |[IWEF]\d{4} [\d:.]+ +\d+ )[IWEF]?\s*[\w/.-]+:\d+\] ")
WAITING_WORDS = ("tpu", "metadata", "grpc", "worker", "retry", "waiting", "tries")


def waited_for(log_lines: list[str]) -> str:
    """The last thing the native log said about the TPU start-up, for a timeout message."""
    for line in reversed(log_lines):
        # glog's prefix ("2026-11-23 10:48:20.498432: I tensorflow/…/file.cc:121] ") says nothing to a user.
        text = GLOG_PREFIX.sub("", line.strip())
        if (
            text
            and not text.startswith(("===", "learning/", "external/"))
            and any(word in text.lower() for word in WAITING_WORDS)
        ):
            return text[:300]
    return ""


def call_with_timeout(function: Callable[[], Any], seconds: float | None, what: str) -> Any:
    """Run a possibly hanging TF call (connect to an unreachable gRPC address); None: no limit."""
    if seconds is None:
        return function()
    box: dict[str, Any] = {}
    log_start = nativelog.active_position()

    def target() -> None:
        try:
            box["value"] = function()
        except BaseException as error:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = error

    thread = threading.Thread(target=target, name=f"tpudash-{what}", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        last = waited_for(nativelog.active_tail(since=log_start))
        raise StartupTimeout(
            f"{what} did not answer within {seconds:g} s"
            + (f"; TensorFlow's last words: {last}" if last else "")
            + " (raise TPUDASH_TPU_TIMEOUT to wait longer)"
        )
    if "error" in box:
        raise box["error"]
    return box.get("value")


def connect_tpu(tf: Any, tpu_argument: str, timeout: float | None) -> tuple[Any, Any, Any]:
    """Resolver → connect → initialize → TPUStrategy, each failure explained."""
    try:
        if tpu_argument == "":
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
        else:
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu_argument)
    except Exception as error:  # noqa: BLE001 - any resolver failure is reported as such
        raise RuntimeSetupError(
            f"TPUClusterResolver(tpu={tpu_argument!r}) failed: {type(error).__name__}: {error}"
        ) from error

    def connect_and_initialize() -> Any:
        if tpu_argument != "local":
            tf.config.experimental_connect_to_cluster(resolver)
        return tf.tpu.experimental.initialize_tpu_system(resolver)

    try:
        topology = call_with_timeout(
            connect_and_initialize, timeout, f"connecting to TPU {tpu_argument or 'from TPU_NAME'}"
        )
    except RuntimeSetupError:
        raise
    except Exception as error:  # noqa: BLE001
        message = str(error).strip().splitlines()[0] if str(error).strip() else ""
        # TensorFlow appends the op's whole attribute list; the op's name says enough.
        message = re.sub(r" with these attrs: \[.*$", "", message)
        raise RuntimeSetupError(
            f"initializing TPU {tpu_argument!r} failed: {type(error).__name__}: {message}"
        ) from error
    if not tf.config.list_logical_devices("TPU"):
        raise RuntimeSetupError(f"TPU {tpu_argument!r} initialized but shows no TPU devices")
    strategy = tf.distribute.TPUStrategy(resolver)
    return resolver, topology, strategy
