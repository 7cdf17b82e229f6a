"""Telemetry never stops without a word: a source that raises, a child that writes what is no answer.

A source's reader is meant to return its reason; one that raises anyway (a
bug, a library's surprise) costs that source's values in that sample, said
in the sample, while the other sources and the loop go on. The TensorCore
probe's child may write lines on its stdout that are no answer (before its
stdout is claimed, or a wrapper's banner): they are skipped, named once in
the log, and the next read still returns its own answer.
"""

from __future__ import annotations

import os
import queue
import stat
import sys

import pytest

from tests.conftest import REPO_ROOT
from tpudash.telemetry.sampling import SamplingLoop, TelemetrySampler
from tpudash.telemetry.tensorcore import TensorCoreProbe

WAIT = 30.0


class RaisingTpuReader:
    """A TPU metrics reader that raises as a library surprise would (here: JSON that was no JSON)."""

    def __init__(self) -> None:
        self.reads = 0

    def read(self):
        self.reads += 1
        raise ValueError("Expecting value: line 1 column 1 (char 0)")

    def close(self) -> None:
        pass


class RaisingTensorCore:
    def read(self):
        raise RuntimeError("the probe's pipe broke")

    def close(self) -> None:
        pass


class ChipsReader(RaisingTpuReader):
    def read(self):
        return [{"chip": 0, "duty_cycle_pct": 50.0}], None


def test_a_source_that_raises_costs_its_values_and_the_loop_goes_on_saying_what_failed():
    samples: queue.Queue = queue.Queue()
    sampler = TelemetrySampler(tpu=RaisingTpuReader())
    loop = SamplingLoop(sampler, 0.01, lambda stamp, sample: samples.put(sample)).start()
    try:
        for _ in range(3):  # not only the first sample: the loop lives on
            sample = samples.get(timeout=WAIT)
            assert sample.unavailable["tpu"] == (
                "the TPU metrics reader failed: ValueError: Expecting value: line 1 column 1 (char 0)"
            )
            assert sample.host["memory_total"] > 0  # the host's values still arrive
    finally:
        loop.stop()


def test_a_tensorcore_probe_that_raises_costs_only_tensorcore():
    sampler = TelemetrySampler(tpu=ChipsReader(), tensorcore=RaisingTensorCore())
    _, sample = sampler.sample()
    assert sample.unavailable == {"tensorcore": "the TensorCore probe failed: RuntimeError: the probe's pipe broke"}
    assert sample.chips == [{"chip": 0, "duty_cycle_pct": 50.0}]


def test_a_consumer_that_raises_is_said_once_and_sampling_goes_on(capsys):
    handed: queue.Queue = queue.Queue()

    def failing_consumer(stamp, sample):
        handed.put(sample)
        raise OSError(28, "No space left on device")

    loop = SamplingLoop(TelemetrySampler(tpu=ChipsReader()), 0.01, failing_consumer).start()
    try:
        for _ in range(3):
            handed.get(timeout=WAIT)
    finally:
        loop.stop()
    assert loop.delivery_failure == "OSError: [Errno 28] No space left on device"
    assert capsys.readouterr().err.count("a telemetry sample could not be handed on") == 1


def fake_libtpu_environment(mode: str, values: str) -> dict[str, str]:
    """The environment of a probe child that imports the stand-in libtpu (tests/fake_libtpu) in ``mode``."""
    return dict(
        os.environ,
        FAKE_LIBTPU=mode,
        FAKE_TENSORCORE_UTIL=values,
        PYTHONPATH=os.pathsep.join([str(REPO_ROOT / "tests" / "fake_libtpu"), str(REPO_ROOT)]),
    )


@pytest.fixture
def python_with_a_banner(tmp_path):
    """An interpreter that writes a line on stdout before Python starts (as a wrapper or a site hook may)."""
    wrapper = tmp_path / "python-with-banner"
    wrapper.write_text(f'#!/bin/sh\necho "Welcome to the TPU VM (a banner)"\nexec {sys.executable} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return str(wrapper)


def test_a_line_on_the_probes_stdout_that_is_no_answer_is_skipped_and_named_once(python_with_a_banner, capsys):
    probe = TensorCoreProbe(python=python_with_a_banner, environment=fake_libtpu_environment("values", "40,60"))
    try:
        for _ in range(3):
            assert probe.read() == ([40.0, 60.0], None)
    finally:
        probe.close()
    said = [line for line in capsys.readouterr().err.splitlines() if "TensorCore probe's child" in line]
    assert said == [
        "tpudash: the TensorCore probe's child wrote 'Welcome to the TPU VM (a banner)' on its stdout, "
        "which is no answer: skipped (later lines like it are skipped without a word)"
    ]
