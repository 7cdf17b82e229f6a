"""TensorCore utilisation from libtpu's in-process SDK, read in a child process: both sides of that child.

libtpu's SDK (``sdk.monitoring.get_metric("tensorcore_util")``) works only
inside the process that imports it, and libtpu can abort or crash that
process (measured: on a host without its runtime agent, libtpu 0.0.17's
``get_metric`` raises RuntimeError, then the process dies of SIGSEGV at
exit; a libtpu that does not match aborts at import). So a child does it:

- the parent (``TensorCoreProbe``, in the sampler) starts
  ``python -m tpudash.telemetry.tensorcore PARENT_PID`` at its first read
  and sends one request per sample, ``{"type": "tensorcore_util"}``,
  through ``tpudash.childproc``: an answer that comes after its deadline is
  dropped, never taken for the next sample's. When the child dies the
  reason names the signal, and it is not started again: it would die the
  same way.
- the child (``main``) claims its stdout for the protocol before libtpu is
  imported (whatever the SDK prints goes to stderr), imports the SDK once,
  answers ``{"values": [percent per core]}`` or ``{"error": "..."}`` until
  its stdin closes, and dies with its parent.

Loading this module imports neither TensorFlow nor libtpu.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from typing import Any

from tpudash.childproc import (
    AnswerTimeout,
    ChildGone,
    Payload,
    RequestChannel,
    claim_stdout,
    parent_death_signal,
    serve_requests,
)
from tpudash.telemetry.sources import Chip

TENSORCORE_PROBE_DEADLINE_SECONDS = 2.0
TENSORCORE_REQUEST = "tensorcore_util"


def libtpu_installed() -> bool:
    """libtpu is importable (found without importing it: importing it is what can abort)."""
    return importlib.util.find_spec("libtpu") is not None


# -- the parent's side ------------------------------------------------------------------------------


class TensorCoreProbe:
    """TensorCore utilisation per core, from libtpu's SDK in a child process started at the first read.

    ``python`` and ``environment``: the child's interpreter and environment
    (default: this one's). ``deadline``: how long one read waits for the
    child, its start included.
    """

    def __init__(
        self,
        python: str | None = None,
        environment: Mapping[str, str] | None = None,
        deadline: float = TENSORCORE_PROBE_DEADLINE_SECONDS,
    ):
        self._command = [python or sys.executable, "-m", "tpudash.telemetry.tensorcore"]
        self._environment = dict(os.environ if environment is None else environment)
        self.deadline = deadline
        self._channel: RequestChannel | None = None
        self.failure: str | None = None
        """Why the probe gave up for good, once it has."""
        self.stray_output_said = False
        """Whether the child's stray stdout (lines that are no answer, skipped) was named in the log yet."""

    def read(self) -> tuple[list[float], str | None]:
        """(utilisation % per core, None) or ([], why not)."""
        if self.failure:
            return [], self.failure
        if self._channel is None:
            self._channel = RequestChannel(
                [*self._command, str(os.getpid())],
                name="tpudash-tensorcore-reader",
                stderr=subprocess.DEVNULL,
                env=self._environment,
            )
        try:
            answer = self._channel.request({"type": TENSORCORE_REQUEST}, self.deadline)
        except AnswerTimeout:
            # The child lives on: its late answer is dropped when it comes.
            return [], f"libtpu's SDK did not answer within {self.deadline:g} s"
        except ChildGone as gone:
            self.close()
            how = _how_it_ended(gone.returncode)
            self.failure = f"libtpu's SDK {how} reading tensorcore_util (kept out of the dashboard's process)"
            return [], self.failure
        finally:
            self._say_stray_output()
        return _per_core(answer)

    def _say_stray_output(self) -> None:
        """Name, once, a line on the child's stdout that was no answer (skipped): the session log tells why."""
        channel = self._channel
        if self.stray_output_said or channel is None or not channel.noise_count:
            return
        self.stray_output_said = True
        first = channel.noise[0] if channel.noise else ""
        print(
            f"tpudash: the TensorCore probe's child wrote {first!r} on its stdout, which is no answer: skipped "
            "(later lines like it are skipped without a word)",
            file=sys.stderr,
            flush=True,
        )

    def close(self) -> None:
        if self._channel is not None:
            self._channel.kill()
            self._channel = None


def _how_it_ended(returncode: int | None) -> str:
    if returncode is None:
        return "stopped answering"
    if returncode < 0:
        return f"died with {signal.Signals(-returncode).name}"
    return f"exited with status {returncode}"


def _per_core(answer: Payload) -> tuple[list[float], str | None]:
    """The child's answer as (values, None) or ([], why not)."""
    if "error" in answer:
        return [], f"libtpu's SDK: {answer['error']}"
    values = answer.get("values")
    if not isinstance(values, list) or not all(
        isinstance(value, (int, float)) and not isinstance(value, bool) for value in values
    ):
        return [], f"libtpu's SDK answered without values: {answer!r:.200}"
    return [float(value) for value in values], None


def add_tensorcore_utilisation(chips: list[Chip], per_core: list[float]) -> None:
    """Each chip's mean TensorCore utilisation, from libtpu's per-core values (cores in chip order)."""
    if not chips or not per_core or len(per_core) % len(chips):
        return
    cores_per_chip = len(per_core) // len(chips)
    for position, chip in enumerate(chips):
        cores = per_core[position * cores_per_chip : (position + 1) * cores_per_chip]
        chip["tensorcore_util_pct"] = sum(cores) / len(cores)


# -- the child's side -------------------------------------------------------------------------------


def _sdk_reader() -> Callable[[Payload], dict[str, Any]]:
    """Import libtpu's SDK once; the function that answers each request from it (or says why it cannot)."""
    monitoring: Any = None
    failure = ""
    try:
        from libtpu import sdk

        monitoring = getattr(sdk, "tpumonitoring", None) or sdk.monitoring
    except (ImportError, AttributeError) as error:
        failure = f"not available ({type(error).__name__}: {error})"

    def answer(request: Payload) -> dict[str, Any]:
        if request.get("type") != TENSORCORE_REQUEST:
            return {"error": f"not a {TENSORCORE_REQUEST} request: {dict(request)!r:.200}"}
        if monitoring is None:
            return {"error": failure}
        try:
            values = monitoring.get_metric("tensorcore_util").data()
            return {"values": [float(str(value).rstrip("%")) for value in values]}
        except Exception as error:  # noqa: BLE001 - an older SDK, no chips: a reason, and the child lives on
            return {"error": f"{type(error).__name__}: {error}"}

    return answer


def main(argv: list[str]) -> int:
    """``python -m tpudash.telemetry.tensorcore [PARENT_PID]``: answer requests until stdin closes."""
    if argv:
        die_with_parent = parent_death_signal(signal.SIGKILL, expected_parent=int(argv[0]))
        if die_with_parent is not None:  # elsewhere than Linux the child still ends when its stdin closes
            die_with_parent()
    replies = claim_stdout()  # before libtpu's import: what it prints must not tear an answer's line
    serve_requests(_sdk_reader(), sys.stdin, replies)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
