"""Try the TPU in a process of its own, bounded, before this process commits to it.

When a host has TPU chips, ``import tensorflow`` loads libtpu, and libtpu's
start-up can hang for minutes (off Google Cloud it asks the metadata server
30 times per variable) while holding Python's import lock and GIL: no thread
of the importing process can time it out, and a process that has started
TensorFlow can no longer split its CPU for the fallback. So a short-lived
child does the import, the resolver and the initialisation; the parent waits
at most the TPU timeout, kills the child if it must, and only then decides.

The child prints one JSON line: ``{"ok": true, "cores": N}`` or
``{"ok": false, "error": "..."}``; its stderr (TensorFlow's and libtpu's
logs) tells what a stuck start-up was waiting for.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass


PR_SET_PDEATHSIG = 1  # from <sys/prctl.h>


@dataclass(frozen=True)
class ProbeResult:
    """What the child found: ``ok``, the TPU cores it saw, or why it failed."""

    ok: bool
    cores: int = 0
    error: str = ""


def probe_tpu(tpu_argument: str, timeout: float) -> ProbeResult:
    """Import TensorFlow and initialise ``tpu_argument`` in a child; never longer than ``timeout``."""
    from tpudash.accel.runtime import waited_for

    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as child_stderr:
        child = subprocess.Popen([sys.executable, "-m", "tpudash.accel.tpuprobe", tpu_argument, str(os.getpid())],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=child_stderr, text=True,
                                 env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0"))
        try:
            output, _ = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
            child_stderr.seek(0)
            last = waited_for(child_stderr.read().splitlines()[-200:])
            return ProbeResult(False, error=f"TensorFlow's TPU start-up did not finish within {timeout:g} s"
                                            + (f"; it was waiting on: {last}" if last else "")
                                            + " (raise TPUDASH_TPU_TIMEOUT to wait longer)")
        child_stderr.seek(0)
        log_lines = child_stderr.read().splitlines()
    for line in reversed(output.splitlines()):
        try:
            answer = json.loads(line)
        except ValueError:
            continue
        return ProbeResult(bool(answer.get("ok")), int(answer.get("cores", 0)), str(answer.get("error", "")))
    # No answer at all: the child died, most often by libtpu's abort.
    last = waited_for(log_lines) or (log_lines[-1].strip()[:300] if log_lines else "")
    return ProbeResult(False, error=f"TensorFlow's TPU start-up ended the process (exit code {child.returncode})"
                                    + (f": {last}" if last else ""))


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel kill this process when its parent dies (Linux).

    A probe left behind by a killed tpudash would keep holding the TPU, and
    libtpu admits one process per host.
    """
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the parent's timeout still applies
        return
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def main(argv: list[str]) -> int:
    from tpudash.accel.runtime import RuntimeSetupError, _connect_tpu

    tpu_argument = argv[0] if argv else "local"
    if len(argv) > 1:
        die_with_parent(int(argv[1]))
    try:
        import tensorflow as tf

        _, _, strategy = _connect_tpu(tf, tpu_argument, timeout=None)  # the parent keeps the time
    except RuntimeSetupError as error:
        print(json.dumps({"ok": False, "error": str(error)}), flush=True)
        return 1
    except Exception as error:  # noqa: BLE001 - every failure is the answer
        first_line = (str(error).strip().splitlines() or [""])[0]
        print(json.dumps({"ok": False, "error": f"{type(error).__name__}: {first_line}"}), flush=True)
        return 1
    print(json.dumps({"ok": True, "cores": int(strategy.num_replicas_in_sync)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
