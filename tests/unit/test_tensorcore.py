"""The TensorCore probe's child speaks tpudash.childproc's protocol: late answers dropped, stray output survived.

The child runs on a stand-in libtpu (tests/fake_libtpu) that can hold an
answer past its deadline or print on stdout as a real SDK may; the sampler's
use of the probe (values joined to chips, a crash costing one value) is in
test_telemetry.py.
"""

from __future__ import annotations

import os

from tests.conftest import REPO_ROOT
from tpudash.telemetry.tensorcore import TensorCoreProbe


def tensorcore_probe(mode: str, values: str = "", **variables: str) -> TensorCoreProbe:
    """A probe whose child imports the stand-in libtpu in ``mode``, serving ``values`` (one percentage per core)."""
    environment = dict(
        os.environ,
        FAKE_LIBTPU=mode,
        FAKE_TENSORCORE_UTIL=values,
        **variables,
        PYTHONPATH=os.pathsep.join([str(REPO_ROOT / "tests" / "fake_libtpu"), str(REPO_ROOT)]),
    )
    return TensorCoreProbe(environment=environment)


def test_an_answer_that_comes_after_its_deadline_is_never_taken_for_the_next_reads(tmp_path):
    gate = tmp_path / "answer-now"
    os.mkfifo(gate)
    probe = tensorcore_probe("late", "10,30", FAKE_LIBTPU_GATE=str(gate))
    probe.deadline = 0.5
    try:
        assert probe.read() == ([], "libtpu's SDK did not answer within 0.5 s")
        # The first answer (99s) now arrives, late, before the second one. The child is blocked
        # opening the gate, so this open finds its reader at once.
        os.close(os.open(gate, os.O_WRONLY))
        probe.deadline = 30.0
        assert probe.read() == ([10.0, 30.0], None)
        assert probe.read() == ([10.0, 30.0], None)
        assert probe.failure is None
    finally:
        probe.close()


def test_what_libtpu_prints_on_stdout_does_not_cost_an_answer():
    probe = tensorcore_probe("chatty", "25,75")
    try:
        for _ in range(2):  # a progress bar without its newline would have torn the next answer's line
            assert probe.read() == ([25.0, 75.0], None)
    finally:
        probe.close()


def test_a_closed_probe_ends_its_child_and_a_new_read_starts_another():
    probe = tensorcore_probe("values", "50")
    try:
        assert probe.read() == ([50.0], None)
        child = probe._channel
        assert child is not None
        probe.close()
        assert probe._channel is None
        assert probe.read() == ([50.0], None) and probe._channel is not child
    finally:
        probe.close()
