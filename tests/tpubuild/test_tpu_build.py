"""The TPU build of TensorFlow (tensorflow-tpu with its libtpu) on a host without a chip.

Run by CI in the ``[tpu]`` environment (``pytest tests/unit tests/tpubuild``),
not in the default run: these need the real TPU wheels (they skip, saying so,
without them). Chips are faked only
at tpu-info's scan (a sitecustomize); TensorFlow and libtpu are real, so the
failures here are the ones a user would meet.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.unit.test_cli import USER_UNSET, run_cli
from tests.unit.test_cli_host import fake_host
from tpudash.accel import hostcheck

pytestmark = [
    pytest.mark.skipif(
        hostcheck.installed_distributions().get("tensorflow-tpu") is None,
        reason="needs the TPU build: pip install '.[tpu,test]'",
    ),
    # libtpu starts here for real, and its lock is the host's (tests/conftest.py's libtpu_turn).
    pytest.mark.usefixtures("libtpu_turn"),
]


def test_a_host_without_chips_gets_the_cpu_default_and_never_starts_libtpu():
    # With libtpu started, even a chipless host shows a TPU_SYSTEM device
    # (and libtpu takes the host's TPU lock); tpudash keeps it from starting.
    script = "\n".join(
        [
            "from tpudash.config import Settings",
            "from tpudash.accel.runtime import get_runtime",
            "runtime = get_runtime(Settings())",
            "import tensorflow as tf  # imported by get_runtime already, after it set libtpu's variables",
            "print(runtime.kind, runtime.num_replicas, sorted({d.device_type for d in tf.config.list_logical_devices()}))",
        ]
    )
    user_environment = {key: value for key, value in os.environ.items() if key not in USER_UNSET}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=user_environment
    )
    assert result.stdout.split() == ["CPU", "8", "['CPU']"], result.stderr[-2000:]

    devices = run_cli("devices", "--json", timeout=300)
    assert devices.returncode == 0, devices.stderr
    description = json.loads(devices.stdout)
    assert description["host_check"]["tensorflow_build"].startswith("tensorflow-tpu 2.20.0")
    assert description["host_check"]["distributions"]["libtpu"] == "0.0.17"
    assert description["host_check"]["diagnoses"] == []
    assert description["reasons"]["TPU"].endswith("no TPU chip on the PCI bus")


def test_chips_that_libtpu_cannot_start_leave_jobs_on_eight_cpu_devices(tmp_path):
    env = {**fake_host(tmp_path / "host", chips=("V4", 4)), "TPUDASH_TPU_TIMEOUT": "15"}
    devices = run_cli("devices", "--json", env=env, timeout=300)
    assert devices.returncode == 0, devices.stderr
    description = json.loads(devices.stdout)
    assert (description["kind"], description["num_replicas"]) == ("CPU", 8)
    reason = description["reasons"]["TPU"]
    assert reason.startswith("the chip scan finds 4 × TPU v4 chip, 32 GiB HBM each")
    assert (
        "but TensorFlow's TPU start-up did not finish within 15 s" in reason
        or "initializing TPU 'local' failed" in reason
    )

    run = run_cli("run", "gradient-descent", env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "0.0022596875205636024 @ [0.01152921 0.04611686]" in run.stdout


def test_an_explicit_local_tpu_that_cannot_start_is_an_error_within_the_timeout(tmp_path):
    env = {**fake_host(tmp_path / "host", chips=("V4", 4)), "TPUDASH_TPU_TIMEOUT": "10"}
    result = run_cli("devices", "--tpu", "local", env=env, timeout=300)
    assert result.returncode == 2
    assert "--tpu local given, but" in result.stderr and "--tpu none runs jobs on the CPU default" in result.stderr


def test_tpu_name_local_on_a_host_without_chips_does_not_ask_libtpu():
    devices = run_cli("devices", "--json", env={"TPU_NAME": "local"}, timeout=300)
    assert devices.returncode == 0, devices.stderr
    description = json.loads(devices.stdout)
    assert description["kind"] == "CPU"
    assert description["reasons"]["TPU"] == "TPU_NAME=local, but the chip scan finds no TPU chip on this host"


def test_the_dashboards_engine_takes_the_cpu_default_in_its_own_process_when_the_chips_cannot_start(tmp_path):
    import queue

    from tpudash.config import Settings
    from tpudash.engine.handle import EngineExit, EngineProcess
    from tpudash.engine.protocol import RuntimeFailed, RuntimeReady

    environment = {key: value for key, value in os.environ.items() if key not in USER_UNSET}
    environment.update(
        fake_host(tmp_path / "host", chips=("V4", 4)), TPUDASH_TPU_TIMEOUT="15", TPUDASH_RUNS_DIR=str(tmp_path / "runs")
    )
    messages: queue.Queue = queue.Queue()
    engine = EngineProcess(
        messages.put, Settings.load(environ=environment), tmp_path / "engine.log", environ=environment
    )
    try:
        kinds = []
        while not kinds or not isinstance(kinds[-1], (RuntimeReady, RuntimeFailed, EngineExit)):
            kinds.append(messages.get(timeout=300))
        answer = kinds[-1]
        assert isinstance(answer, RuntimeReady), answer
        description = answer.description
        assert (description["kind"], description["num_replicas"]) == ("CPU", 8)
        assert description["reasons"]["TPU"].startswith("the chip scan finds 4 × TPU v4 chip")
    finally:
        engine.release()
    exited = messages.get(timeout=60)
    while not isinstance(exited, EngineExit):
        exited = messages.get(timeout=60)
    assert exited.requested and exited.returncode == 0


def test_the_real_libtpu_sdk_is_asked_in_a_child_and_its_failure_costs_only_tensorcore_utilisation():
    # Measured: without libtpu's runtime agent, libtpu 0.0.17's
    # sdk.monitoring.get_metric("tensorcore_util") raises RuntimeError, and the
    # process that imported the SDK then dies of SIGSEGV at exit. In the
    # dashboard's process that would be the dashboard; in the probe's child
    # it is one missing value with the SDK's reason.
    from tests.fake_tpu_metrics import FakeTpuMetrics
    from tpudash.telemetry.sampling import TelemetrySampler
    from tpudash.telemetry.tensorcore import TensorCoreProbe

    with FakeTpuMetrics(chips=4) as fake:
        sampler = TelemetrySampler(fake.address, tensorcore=TensorCoreProbe())
        _, sample = sampler.sample()
        sampler.close()
    assert sample.unavailable["tensorcore"].startswith("libtpu's SDK: RuntimeError: "), sample.unavailable
    assert len(sample.chips) == 4 and "tpu" not in sample.unavailable


def test_mfu_counts_a_step_without_host_xla_from_the_graph_and_says_why(runtime):
    # Measured: tensorflow-tpu links no XLA backend for the host's CPU ("Could not find a transfer manager for
    # platform Host"), so a CPU run's FLOPs per step come from the graph's float-op count, and say so.
    from jobs.models import build_model
    from tests.unit.test_advice_mfu import cifar_cnn_train_flops_by_hand
    from tpudash.advice.flops import step_flops_keras_tf

    count = step_flops_keras_tf(build_model("cifar-cnn", (32, 32, 3), 10), batch_size=8)
    assert count.source.startswith("the graph's float-op count") and "XLA could not compile the step" in count.source
    hand = cifar_cnn_train_flops_by_hand(8)
    assert count.flops is not None and hand < count.flops < 1.5 * hand
