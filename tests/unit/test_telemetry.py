"""Telemetry: TPU values from libtpu's metrics service (a fake one, on tpu-info's own servicer), host values, records.

The fake serves scripted numbers; each test checks those numbers arrive
where a user reads them (a sample, the run record, the export, the CLI), and
that a service that is missing, stops, hangs or lacks a metric is a reason
in words, never an exception, with sampling resuming when it is back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import grpc
import pytest

from jobs.events import Metric, RunStarted, Telemetry
from tests.conftest import REPO_ROOT
from tests.fake_tpu_metrics import GIB, FakeTpuMetrics, _Servicer
from tests.unit.test_tensorcore import tensorcore_probe
from tpudash.config import Settings, SettingsError
from tpudash.runs.follow import RunFollower
from tpudash.runs.layout import TELEMETRY_FILE
from tpudash.runs.model import RunModel
from tpudash.runs.store import RunStore
from tpudash.runs.tail import read_events
from tpudash.runs.telemetry_samples import idle_accelerator_hint, scalars
from tpudash.telemetry.recorder import TelemetryRecorder
from tpudash.telemetry.sampling import TelemetrySampler
from tpudash.telemetry.sources import (
    NO_CHIPS_RETRY_SECONDS,
    AddressError,
    HostMetrics,
    TpuMetricsClient,
    parse_metrics_address,
)

DUTY = {0: 87.5, 1: 62.5, 2: 25.0, 3: 12.5}
USED = {0: 4 * GIB, 1: 2 * GIB, 2: GIB, 3: 0}


@pytest.fixture
def fake():
    with FakeTpuMetrics(chips=4) as server:
        server.set(duty=DUTY, used=USED, bandwidth={0: 40.0, 1: 30.0, 2: 20.0, 3: 10.0})
        yield server


def test_each_chips_duty_cycle_hbm_and_bandwidth_arrive_as_served(fake):
    sampler = TelemetrySampler(fake.address)
    _, sample = sampler.sample()
    assert sample.unavailable == {}
    assert [
        (chip["chip"], chip["duty_cycle_pct"], chip["hbm_used"], chip["hbm_total"], chip["hbm_bandwidth_pct"])
        for chip in sample.chips
    ] == [
        (0, 87.5, 4 * GIB, 16 * GIB, 40.0),
        (1, 62.5, 2 * GIB, 16 * GIB, 30.0),
        (2, 25.0, GIB, 16 * GIB, 20.0),
        (3, 12.5, 0, 16 * GIB, 10.0),
    ]
    sampler.close()


def test_two_cores_per_chip_add_up_to_the_chips_hbm_as_tpu_info_pairs_them():
    # v2/v3: libtpu reports memory per TensorCore and the duty cycle per chip.
    with FakeTpuMetrics(chips=2, cores_per_chip=2, hbm_total=8 * GIB) as server:
        server.set(
            duty={0: 50.0, 1: 10.0},
            used={0: GIB, 1: GIB, 2: 3 * GIB, 3: 0},
            bandwidth={0: 10.0, 1: 30.0, 2: 0.0, 3: 0.0},
        )
        chips, reason = TpuMetricsClient(server.address).read()
    assert reason is None
    assert chips == [
        {"chip": 0, "duty_cycle_pct": 50.0, "hbm_used": 2 * GIB, "hbm_total": 16 * GIB, "hbm_bandwidth_pct": 20.0},
        {"chip": 1, "duty_cycle_pct": 10.0, "hbm_used": 3 * GIB, "hbm_total": 16 * GIB, "hbm_bandwidth_pct": 0.0},
    ]


def test_a_libtpu_without_the_bandwidth_metric_still_gives_duty_cycle_and_hbm(fake):
    fake.set(drop_bandwidth=True)
    chips, reason = TpuMetricsClient(fake.address).read()
    assert reason is None
    assert [chip["duty_cycle_pct"] for chip in chips] == list(DUTY.values())
    assert all(chip["hbm_bandwidth_pct"] is None for chip in chips)


def test_the_service_stopping_is_a_reason_and_sampling_resumes_when_it_returns(fake):
    sampler = TelemetrySampler(fake.address)
    assert sampler.sample()[1].chips
    fake.stop()
    _, gone = sampler.sample()
    assert gone.chips == [] and gone.host["memory_total"] > 0  # the host side goes on
    assert gone.unavailable["tpu"] == (
        f"no TPU metrics service at {fake.address}: connection refused "
        "(libtpu serves it while a TensorFlow or JAX process holds the TPU)"
    )
    fake.start()  # the same port
    fake.set(duty={0: 5.0, 1: 5.0, 2: 5.0, 3: 5.0})
    _, back = sampler.sample()
    assert back.unavailable == {} and [chip["duty_cycle_pct"] for chip in back.chips] == [5.0] * 4
    sampler.close()


def test_the_service_stopping_while_it_answers_says_so_in_plain_words(fake):
    # A TensorFlow process that ends takes libtpu's service with it, a sample's call perhaps in flight:
    # gRPC says "Cancelling all calls", which names no cause a user knows.
    client = TpuMetricsClient(fake.address)
    assert client.read()[1] is None
    fake.hold_answers()
    read: list = []
    sampling = threading.Thread(target=lambda: read.append(client.read()))
    sampling.start()
    assert fake.call_arrived.wait(30)
    fake.stop()
    sampling.join(30)
    chips, reason = read[0]
    hint = "(libtpu serves it while a TensorFlow or JAX process holds the TPU)"
    assert chips == [] and reason == f"no TPU metrics service at {fake.address}: it stopped while answering {hint}"
    assert client.read()[1] == f"no TPU metrics service at {fake.address}: connection refused {hint}"
    client.close()


def test_no_chips_on_the_host_says_so_rather_than_connection_refused():
    with FakeTpuMetrics() as server:
        address = server.address
    chips, reason = TpuMetricsClient(address, chips_on_host=0).read()
    assert chips == [] and reason == f"no TPU chips on this host (and no TPU metrics service at {address})"


def test_a_host_without_chips_asks_a_refusing_service_again_only_every_half_minute():
    with FakeTpuMetrics(chips=2) as server:
        address = server.address
        server.set(duty={0: 50.0, 1: 25.0}, used={0: GIB, 1: GIB})
        server.stop()
        now = [100.0]
        client = TpuMetricsClient(address, chips_on_host=0, clock=lambda: now[0])
        asked = len(server.requests)
        chips, reason = client.read()
        assert chips == [] and reason.startswith("no TPU chips on this host")
        server.start()  # a service that appears: not asked for within the half minute, the same reason given
        now[0] += NO_CHIPS_RETRY_SECONDS - 1
        assert client.read() == ([], reason) and len(server.requests) == asked
        now[0] += 1
        chips, reason = client.read()
        assert reason is None and [chip["duty_cycle_pct"] for chip in chips] == [50.0, 25.0]
        server.stop()  # one that answered once is asked at every sample again: its going away is news
        now[0] += 1
        assert client.read()[1].startswith(f"no TPU metrics service at {address}")
        server.start()
        now[0] += 1
        assert client.read()[1] is None
        client.close()


def test_a_host_with_chips_or_an_unknown_count_asks_at_every_sample():
    with FakeTpuMetrics(chips=1) as server:
        server.set(duty={0: 50.0}, used={0: GIB})
        for chips_on_host in (None, 4):
            server.stop()
            client = TpuMetricsClient(server.address, chips_on_host=chips_on_host, clock=lambda: 0.0)
            assert client.read()[0] == []
            server.start()
            assert client.read()[1] is None, chips_on_host
            client.close()


def test_a_service_that_does_not_answer_is_given_up_on_at_the_deadline():
    hang = threading.Event()

    class Hanging(_Servicer):
        def GetRuntimeMetric(self, request, context):
            hang.wait(10)
            return super().GetRuntimeMetric(request, context)

    server = FakeTpuMetrics()
    from concurrent import futures

    from tpu_info.proto import tpu_metric_service_pb2_grpc as service

    grpc_server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    service.add_RuntimeMetricServiceServicer_to_server(Hanging(server), grpc_server)
    port = grpc_server.add_secure_port("127.0.0.1:0", grpc.local_server_credentials())
    grpc_server.start()
    try:
        chips, reason = TpuMetricsClient(f"127.0.0.1:{port}", deadline=0.3).read()
    finally:
        hang.set()
        grpc_server.stop(None)
    assert chips == [] and reason == f"the TPU metrics service at 127.0.0.1:{port} did not answer within 0.3 s"


def test_host_values_are_this_machines():
    host = HostMetrics()
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        threading.Event().wait(0.5)  # the window psutil measures CPU over, not a synchronisation
        values = host.read({"me": os.getpid(), "gone": 2**22 + 12345})
    finally:
        spinner.kill()
        spinner.wait()
    assert len(values["cpu_pct"]) == os.cpu_count()
    assert all(0.0 <= core <= 100.0 for core in values["cpu_pct"])
    assert sum(values["cpu_pct"]) >= 50.0  # one core spun the whole window
    with open("/proc/meminfo") as meminfo:
        total_kib = next(int(line.split()[1]) for line in meminfo if line.startswith("MemTotal:"))
    assert values["memory_total"] == total_kib * 1024
    assert 0 < values["memory_used"] < values["memory_total"]
    with open("/proc/self/statm") as statm:
        resident = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    assert abs(values["processes"]["me"] - resident) < 0.2 * resident
    assert "gone" not in values["processes"]  # a process that does not exist is left out


@pytest.mark.parametrize(
    "text, message",
    [
        ("10.1.2.3:8431", "10.1.2.3 is not this host"),
        ("localhost", "has no port"),
        ("localhost:http", "port 'http' is not a number"),
        ("127.0.0.1:70000", "port 70000 is out of range 1 to 65535"),
    ],
)
def test_a_metrics_address_that_cannot_be_libtpus_is_refused_naming_what_is_allowed(text, message):
    with pytest.raises(AddressError, match=message):
        parse_metrics_address(text)
    with pytest.raises(SettingsError, match=f"TPUDASH_TPU_METRICS: .*{message}.*allowed: HOST:PORT on this host"):
        Settings.load({}, {"TPUDASH_TPU_METRICS": text})


def test_metrics_address_and_interval_come_from_flags_over_variables():
    settings = Settings.load(
        {"tpu_metrics": "[::1]:9000"}, {"TPUDASH_TPU_METRICS": "localhost:1", "TPUDASH_TELEMETRY_INTERVAL": "0"}
    )
    assert settings.tpu_metrics == "[::1]:9000" and settings.telemetry_interval == 0
    with pytest.raises(SettingsError, match=r"--telemetry-interval: 0.01 is out of range; allowed: 0 \(off\) or 0.1"):
        Settings.load({"telemetry_interval": "0.01"}, {})


def test_the_recorder_writes_each_live_runs_file_once_even_with_two_observers(tmp_path, fake):
    run_a, run_b = tmp_path / "a", tmp_path / "b"
    run_a.mkdir()
    sampler = TelemetrySampler(fake.address)
    first, second = TelemetryRecorder(), TelemetryRecorder()
    for _ in range(3):
        stamp, sample = sampler.sample()
        first.record(stamp, sample, [run_a, run_b])  # b has no directory yet: nothing, no error
        second.record(stamp, sample, [run_a])  # the dashboard and `tpudash watch` on one run
    samples, problems = read_events(run_a / TELEMETRY_FILE)
    assert problems == [] and len(samples) == 3
    assert [chip["duty_cycle_pct"] for chip in samples[0][1].chips] == list(DUTY.values())
    assert not (run_b / TELEMETRY_FILE).exists()
    first.record(*sampler.sample(), [])  # run a ended for the first: it lets go
    second.record(*sampler.sample(), [run_a])
    assert len(read_events(run_a / TELEMETRY_FILE)[0]) == 4
    first.close(), second.close(), sampler.close()


def samples_at(start: float, duties: list[float | None], step: float = 1.0) -> list[tuple[float, Telemetry]]:
    return [
        (
            start + index * step,
            Telemetry(
                chips=[] if duty is None else [{"chip": 0, "duty_cycle_pct": duty}],
                host={"cpu_pct": [50.0, 30.0], "memory_used": 1, "memory_total": 4},
            ),
        )
        for index, duty in enumerate(duties)
    ]


def test_an_idle_tpu_while_training_gets_the_input_pipeline_advice_and_a_busy_one_none():
    idle = idle_accelerator_hint(samples_at(100.0, [20.0] * 10), now=110.0)
    assert idle.startswith("the TPU was busy 20% of the last 30 s while training")
    assert "prefetch(tf.data.AUTOTUNE)" in idle and "steps_per_execution" in idle and ".cache()" in idle
    assert idle_accelerator_hint(samples_at(100.0, [80.0] * 10), now=110.0) is None
    assert idle_accelerator_hint(samples_at(100.0, [20.0] * 4), now=104.0) is None  # too few samples to judge
    assert idle_accelerator_hint(samples_at(0.0, [20.0] * 10), now=100.0) is None  # long ago
    assert idle_accelerator_hint(samples_at(100.0, [None] * 10), now=110.0) is None  # no TPU values at all


def test_the_run_model_puts_telemetry_on_the_runs_time_axis_and_advises_only_while_it_trains():
    model = RunModel()
    model.apply(RunStarted("r", "train", {}, {}, 1000.0), 1000.0)
    for stamp, sample in samples_at(1002.0, [20.0] * 6):
        model.apply(sample, stamp)
    assert model.telemetry["TPU duty cycle"].points() == ([2.0, 3.0, 4.0, 5.0, 6.0, 7.0], [20.0] * 6)
    assert model.telemetry["host CPU"].points()[1] == [40.0] * 6
    assert model.telemetry["host memory"].points()[1] == [25.0] * 6
    assert model.idle_accelerator_hint(now=1008.0) is None  # no metric yet: not training
    model.apply(Metric("batch_loss", 1.0, 1, epoch=0), 1007.5)
    assert "busy 20%" in model.idle_accelerator_hint(now=1008.0)


def test_history_replays_and_export_includes_the_telemetry_recorded_with_a_run(store, fake):
    recorder = store.create("20261123-000000-train-abcdef", "train", {}, {})
    recorder.record(RunStarted("20261123-000000-train-abcdef", "train", {}, {}, 1000.0), 1000.0)
    sampler, telemetry = TelemetrySampler(fake.address), TelemetryRecorder()
    for _ in range(2):
        telemetry.record(*sampler.sample(), [recorder.run_dir])
    telemetry.close(), sampler.close()
    recorder.close()
    follower = RunFollower(RunStore(store.root), "20261123-000000-train-abcdef")
    follower.poll()
    assert follower.model.telemetry["TPU duty cycle"].points()[1] == [46.875, 46.875]  # mean of the four chips
    csv_text = store.export("20261123-000000-train-abcdef", "csv")
    assert csv_text.count(",tpu0_duty_cycle_pct,telemetry,") == 2
    assert ",tpu3_hbm_total,telemetry,0,,17179869184.0" in csv_text
    exported = json.loads(store.export("20261123-000000-train-abcdef", "json"))
    assert [chip["hbm_used"] for chip in exported["telemetry"][0]["chips"]] == list(USED.values())


def test_scalars_name_every_value_of_a_sample():
    sample = Telemetry(
        chips=[{"chip": 1, "duty_cycle_pct": 10.0, "hbm_used": 5, "hbm_total": 10, "hbm_bandwidth_pct": None}],
        host={"cpu_pct": [10.0, 30.0], "memory_used": 2, "memory_total": 8, "processes": {"engine": 1234}},
    )
    assert scalars(sample) == {
        "tpu1_duty_cycle_pct": 10.0,
        "tpu1_hbm_used": 5.0,
        "tpu1_hbm_total": 10.0,
        "host_cpu_pct": 20.0,
        "host_memory_used": 2.0,
        "host_memory_total": 8.0,
        "engine_rss": 1234.0,
    }


def run_cli(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tpudash", *arguments], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )


def test_telemetry_once_prints_the_served_values_as_json_and_as_tables_in_80_columns(fake):
    completed = run_cli("telemetry", "--once", "--json", "--tpu-metrics", fake.address)
    assert completed.returncode == 0, completed.stderr
    sample = json.loads(completed.stdout)
    assert sample["type"] == "telemetry" and sample["unavailable"] == {}
    assert [chip["duty_cycle_pct"] for chip in sample["chips"]] == list(DUTY.values())
    assert len(sample["host"]["cpu_pct"]) == os.cpu_count()
    shown = run_cli("telemetry", "--once", "--tpu-metrics", fake.address)
    assert shown.returncode == 0, shown.stderr
    assert "4.0/16.0 GiB" in shown.stdout and "88%" in shown.stdout and "CPU (" in shown.stdout
    assert "…" not in shown.stdout  # fits 80 columns, nothing cut
    # Into a pipe, as every command's output: lines as long as what they say, never padded with spaces.
    assert not [line for line in shown.stdout.splitlines() if line.endswith(" ")]


def test_telemetry_without_a_service_says_why_and_a_bad_address_exits_2(fake):
    address = fake.address
    fake.stop()
    completed = run_cli("telemetry", "--once", "--tpu-metrics", address)
    assert completed.returncode == 0
    # This machine's PCI bus has no TPU: that, not the refused connection, is the reason.
    assert f"TPU no TPU chips on this host (and no TPU metrics service at {address})" in " ".join(
        completed.stdout.split()
    )
    bad = run_cli("telemetry", "--once", "--tpu-metrics", "10.0.0.1:8431")
    assert bad.returncode == 2 and "--tpu-metrics: '10.0.0.1:8431': 10.0.0.1 is not this host" in bad.stderr


def test_tensorcore_utilisation_comes_from_libtpus_sdk_in_a_child_and_joins_each_chip(fake):
    sampler = TelemetrySampler(fake.address, tensorcore=tensorcore_probe("values", "10,30,50,70,20,20,0,100"))
    for _ in range(2):  # the child stays, answering each sample
        _, sample = sampler.sample()
        assert [chip["tensorcore_util_pct"] for chip in sample.chips] == [20.0, 60.0, 20.0, 50.0]
        assert "tensorcore" not in sample.unavailable
    assert scalars(sample)["tpu1_tensorcore_util_pct"] == 60.0
    sampler.close()


def test_a_libtpu_that_crashes_reading_tensorcore_util_costs_only_that_value(fake):
    sampler = TelemetrySampler(fake.address, tensorcore=tensorcore_probe("crash"))
    for _ in range(2):  # said once, not retried into the same crash
        _, sample = sampler.sample()
        assert sample.unavailable["tensorcore"] == (
            "libtpu's SDK died with SIGSEGV reading tensorcore_util (kept out of the dashboard's process)"
        )
        assert [chip["duty_cycle_pct"] for chip in sample.chips] == list(DUTY.values())
    assert sampler.tensorcore._channel is None  # the dead child reaped, and not started again
    sampler.close()
    failing = tensorcore_probe("error")
    chips, reason = failing.read()
    failing.close()
    assert (
        chips == [] and reason == "libtpu's SDK: RuntimeError: metric tensorcore_util is not supported by this libtpu"
    )
