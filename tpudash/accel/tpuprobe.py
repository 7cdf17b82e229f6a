"""Try the TPU in a process of its own, bounded, before this process commits to it.

When a host has TPU chips, ``import tensorflow`` loads libtpu, and libtpu's
start-up can hang for minutes (off Google Cloud it asks the metadata server
30 times per variable) while holding Python's import lock and GIL: no thread
of the importing process can time it out, and a process that has started
TensorFlow can no longer split its CPU for the fallback. So a short-lived
child does the import, the resolver and the initialisation; the parent waits
at most the TPU timeout, kills the child if it must, and only then decides.

The child (``python -m tpudash.accel.tpuprobe PARENT_PID``) answers one
request line, ``{"type": "probe", "tpu": ...}``, through ``tpudash.childproc``:
``{"ok": true, "cores": N}`` or ``{"ok": false, "error": "..."}``, then exits
when its stdin closes. Its stderr (TensorFlow's and libtpu's logs) tells
what a stuck start-up was waiting for. It dies with its parent: a probe left
behind by a killed tpudash would keep holding the TPU, and libtpu admits one
process per host.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tpudash.accel.startup import RuntimeSetupError, connect_tpu, waited_for
from tpudash.childproc import (
    AnswerTimeout,
    ChildGone,
    RequestChannel,
    claim_stdout,
    parent_death_signal,
    serve_requests,
)

PROBE_REQUEST = "probe"


@dataclass(frozen=True)
class ProbeResult:
    """What the child found: ``ok``, the TPU cores it saw, or why it failed."""

    ok: bool
    cores: int = 0
    error: str = ""


def probe_tpu(tpu_argument: str, timeout: float) -> ProbeResult:
    """Import TensorFlow and initialise ``tpu_argument`` in a child; never longer than ``timeout``."""
    started = time.monotonic()
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as child_stderr:
        child = RequestChannel(
            [sys.executable, "-m", "tpudash.accel.tpuprobe", str(os.getpid())],
            name="tpudash-tpu-probe-reader",
            stderr=child_stderr,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0"),
        )
        try:
            answer = child.request({"type": PROBE_REQUEST, "tpu": tpu_argument}, timeout)
        except AnswerTimeout:
            child.kill()
            child_stderr.seek(0)
            last = waited_for(child_stderr.read().splitlines()[-200:])
            return ProbeResult(
                False,
                error=f"TensorFlow's TPU start-up did not finish within {timeout:g} s"
                + (f"; it was waiting on: {last}" if last else "")
                + " (raise TPUDASH_TPU_TIMEOUT to wait longer)",
            )
        except ChildGone:
            # No answer at all: the child died, most often by libtpu's abort.
            returncode = child.kill()
            child_stderr.seek(0)
            log_lines = child_stderr.read().splitlines() + child.noise
            last = waited_for(log_lines) or (log_lines[-1].strip()[:300] if log_lines else "")
            return ProbeResult(
                False,
                error=f"TensorFlow's TPU start-up ended the process (exit code {returncode})"
                + (f": {last}" if last else ""),
            )
        # The child holds the TPU until it exits: it must be gone before this process takes it.
        child.finish(max(0.0, timeout - (time.monotonic() - started)))
    return _result(answer)


def _result(answer: Mapping[str, Any]) -> ProbeResult:
    cores = answer.get("cores", 0)
    if not isinstance(cores, int) or isinstance(cores, bool) or not 0 <= cores < 1 << 20:
        cores = 0  # an answer from another version, or a line that only looks like one
    error = answer.get("error", "")
    return ProbeResult(answer.get("ok") is True, cores, (error if isinstance(error, str) else repr(error))[:2000])


def _answer(request: Mapping[str, Any]) -> dict[str, Any]:
    """The child's side: the import, the resolver and the initialisation, every failure the answer."""
    if request.get("type") != PROBE_REQUEST or not isinstance(request.get("tpu"), str):
        return {"ok": False, "error": f"not a probe request: {dict(request)!r:.200}"}
    try:
        import tensorflow as tf

        _, _, strategy = connect_tpu(tf, request["tpu"], timeout=None)  # the parent keeps the time
    except RuntimeSetupError as error:
        return {"ok": False, "error": str(error)}
    except Exception as error:  # noqa: BLE001 - every failure is the answer
        first_line = (str(error).strip().splitlines() or [""])[0]
        return {"ok": False, "error": f"{type(error).__name__}: {first_line}"}
    return {"ok": True, "cores": int(strategy.num_replicas_in_sync)}


def main(argv: list[str]) -> int:
    if argv:
        die_with_parent = parent_death_signal(signal.SIGKILL, expected_parent=int(argv[0]))
        if die_with_parent is not None:  # elsewhere than Linux the parent's timeout still applies
            die_with_parent()
    serve_requests(_answer, sys.stdin, claim_stdout())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
