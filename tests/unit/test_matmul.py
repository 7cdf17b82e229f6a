"""The matmul device check: every device passes, a wrong result fails and is named."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from jobs import get_job
from jobs.base import JobContext, ParamError
from jobs.checks import relative_tolerance
from jobs.events import Progress
from jobs.matmul import padding_warnings, parse_device_selection
from tpudash.cli import main as cli

SMALL = {"m": 48, "k": 64, "n": 40, "repeats": 2}


def run_dirs(runs_dir):
    return (
        [path for path in runs_dir.iterdir() if path.is_dir() and not path.name.startswith(".")]
        if runs_dir.exists()
        else []
    )


def final_rows(result) -> dict:
    """The per-device table as {device: row as a dict}."""
    [table] = result.tables()
    return {row[0]: dict(zip(table.columns, row)) for row in table.rows}


def test_every_device_passes_with_one_row_and_one_gflops_value_each(run_job, runtime):
    result = run_job("matmul", **SMALL)
    assert result.status == "done"
    rows = final_rows(result)
    assert list(rows) == runtime.device_names
    assert all(row["result"] == "pass" for row in rows.values())
    assert all(row["relative error"] <= row["tolerance"] for row in rows.values())
    [gflops] = result.replica_values("gflops")
    assert gflops.devices == runtime.device_names
    assert all(value > 0 for value in gflops.values)
    summary = result.summary
    assert summary["all_passed"] is True and summary["failed_devices"] == []
    assert summary["fastest_device"] in runtime.device_names and summary["slowest_device"] in runtime.device_names
    assert summary["gflops"][summary["fastest_device"]] == max(gflops.values)
    assert 0 <= summary["spread"] < 1
    progress = [event for event in result.of_type(Progress)]
    assert [event.done for event in progress] == list(range(9)) and {event.unit for event in progress} == {"device"}


def test_a_chosen_subset_of_devices_is_checked_in_the_order_given(run_job, runtime):
    result = run_job("matmul", devices="5,1-2", **SMALL)
    assert result.status == "done"
    names = runtime.device_names
    assert list(final_rows(result)) == [names[5], names[1], names[2]]


def test_tiny_shapes_print_the_product_of_the_seeded_matrices(run_job, runtime):
    result = run_job("matmul", m=2, k=3, n=2, seed=7, devices="0", repeats=1)
    assert result.status == "done"
    generator = np.random.default_rng(7)
    a = generator.standard_normal((2, 3), dtype=np.float32).astype(np.float64)
    b = generator.standard_normal((3, 2), dtype=np.float32).astype(np.float64)
    [printed] = [line for line in result.logs() if line.startswith(runtime.device_names[0] + ": [[")]
    np.testing.assert_allclose(json.loads(printed.split(": ", 1)[1]), a @ b, rtol=1e-5)


def test_large_shapes_do_not_print_the_product(run_job):
    result = run_job("matmul", m=9, k=4, n=2, devices="0", repeats=1)
    assert not any("[[" in line for line in result.logs())


def test_an_injected_error_fails_the_run_and_names_only_that_device(run_job, runtime, store):
    bad = runtime.device_names[3]
    result = run_job("matmul", inject_error=0.01, inject_device=3, **SMALL)
    assert result.status == "failed"
    assert bad in result.finished.error
    assert not any(name in result.finished.error for name in runtime.device_names if name != bad)
    rows = final_rows(result)
    assert rows[bad]["result"] == "FAIL"
    assert [name for name, row in rows.items() if row["result"] != "pass"] == [bad]
    assert any(bad in line and "failed" in line for line in result.logs())
    recorded = store.load(result.run.run_id).info
    assert recorded.status == "failed"
    assert recorded.summary["all_passed"] is False and recorded.summary["failed_devices"] == [bad]


def test_bfloat16_needs_its_looser_tolerance_and_it_still_catches_a_wrong_result(run_job):
    correct = run_job("matmul", dtype="bfloat16", devices="0,1", **SMALL)
    assert correct.status == "done"
    row = final_rows(correct)[next(iter(final_rows(correct)))]
    # A float32 tolerance would have failed a correct bfloat16 device.
    assert row["relative error"] > relative_tolerance("float32", SMALL["k"])
    assert row["relative error"] <= row["tolerance"]
    wrong = run_job("matmul", dtype="bfloat16", devices="0,1", inject_error=0.05, inject_device=1, **SMALL)
    assert wrong.status == "failed"
    assert [name for name, row in final_rows(wrong).items() if row["result"] == "FAIL"] == [list(final_rows(wrong))[1]]


def test_float16_is_checked_too(run_job):
    result = run_job("matmul", dtype="float16", devices="0", **SMALL)
    assert result.status == "done" and result.summary["all_passed"]


def test_tolerance_is_looser_for_narrow_dtypes_and_grows_with_k():
    assert relative_tolerance("float32", 64) < relative_tolerance("float16", 64) < relative_tolerance("bfloat16", 64)
    assert relative_tolerance("float32", 4096) > relative_tolerance("float32", 64)
    # Reduced-precision float32 (TPU bfloat16 passes) is allowed for only when asked.
    assert relative_tolerance("float32", 64, 2.0**-8) > relative_tolerance("bfloat16", 64) * 0.9


def test_padding_warnings_name_each_badly_sized_dimension_and_the_waste():
    assert padding_warnings(128, 256, 384) == []
    assert padding_warnings(8, 128, 128) == []
    lines = padding_warnings(100, 256, 130)
    assert len(lines) == 3
    assert "m=100" in lines[0] and "104" in lines[0] and "3.8%" in lines[0]
    assert "n=130" in lines[1] and "256" in lines[1] and "49.2%" in lines[1]
    assert "51.2%" in lines[2]


class TpuLookingRuntime:
    """The real CPU devices, labelled as a TPU session, to see the TPU-only advice."""

    def __init__(self, runtime):
        self.logical_devices = runtime.logical_devices
        self.device_names = runtime.device_names
        self.kind = "TPU"


def test_on_a_tpu_the_check_warns_about_padding(runtime, tmp_path):
    events = []
    spec = get_job("matmul")
    params = spec.resolve({"m": 100, "k": 64, "n": 128, "devices": "0", "repeats": 1})
    context = JobContext(
        runtime=TpuLookingRuntime(runtime), emit=events.append, run_dir=tmp_path, cancel_event=threading.Event()
    )
    summary = spec.run(context, params)
    assert summary["all_passed"]
    warnings = [event.text for event in events if event.type == "log" and event.level == "warning"]
    assert any(line.startswith("m=100 ") for line in warnings)
    assert any(line.startswith("k=64 ") and "50.0%" in line for line in warnings)
    assert not any(line.startswith("n=") for line in warnings)


def test_no_padding_advice_off_a_tpu(run_job):
    result = run_job("matmul", m=100, k=64, n=100, devices="0", repeats=1)
    assert not any("MXU" in line for line in result.logs())


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"m": "0"}, "m"),
        ({"k": "-3"}, "k"),
        ({"n": "100000"}, "n"),
        ({"dtype": "float64"}, "dtype"),
        ({"repeats": "0"}, "repeats"),
        ({"devices": "0,x"}, "devices"),
        ({"devices": "3,3"}, "devices"),
        ({"devices": "4-2"}, "devices"),
        ({"inject_error": "-1"}, "inject_error"),
    ],
)
def test_bad_params_are_rejected_naming_the_field(overrides, field):
    with pytest.raises(ParamError) as raised:
        get_job("matmul").resolve(overrides)
    assert raised.value.field == field


def test_device_selection_text():
    assert parse_device_selection("all") is None
    assert parse_device_selection(" 0, 2,5-7 ") == (0, 2, 5, 6, 7)


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ("devices=8", "devices: device 8 is out of range; this session has 8 devices (0-7)"),
        ("devices=1-9", "devices: device 8 is out of range"),
        ("dtype=int8", "dtype: 'int8' is not allowed; allowed: one of float32, bfloat16, float16"),
        ("m=0", "m: 0 is out of range"),
    ],
)
def test_the_cli_exits_2_for_bad_values_and_creates_no_run(assignment, message, runtime, isolated_runs_dir, capsys):
    assert cli.main(["run", "matmul", "--set", assignment]) == 2
    assert message in capsys.readouterr().err
    assert run_dirs(isolated_runs_dir) == []


def test_the_injected_device_must_be_one_that_is_checked(runtime):
    spec = get_job("matmul")
    params = spec.resolve({"devices": "0,1", "inject_error": "0.1", "inject_device": "5"})
    with pytest.raises(ParamError) as raised:
        spec.check_runtime(params, runtime)
    assert raised.value.field == "inject_device"


def test_cancel_between_devices_is_recorded_as_cancelled_with_the_devices_done(run_job, runtime, store):
    def cancel_after_first_device(run, event):
        if isinstance(event, Progress) and event.done == 1:
            run.cancel_event.set()

    result = run_job("matmul", on_event=cancel_after_first_device, **SMALL)
    assert result.status == "cancelled"
    assert store.load(result.run.run_id).info.status == "cancelled"
    assert list(final_rows(result)) == [runtime.device_names[0]]
    assert result.replica_values("gflops") == []


def test_cancel_on_the_first_progress_event_stops_before_any_device(run_job):
    result = run_job(
        "matmul", on_event=lambda run, event: run.cancel_event.set() if isinstance(event, Progress) else None, **SMALL
    )
    assert result.status == "cancelled"
    assert result.tables() == []


def test_cancel_while_a_device_is_timed_stops_after_the_multiply_in_flight(run_job, monkeypatch):
    import jobs.matmul

    calls = []
    current = {}
    real_make_multiply = jobs.matmul.make_multiply

    def counting_make_multiply(tf):
        multiply = real_make_multiply(tf)

        def counted(a, b):
            calls.append(1)
            if len(calls) == 3:
                current["run"].cancel_event.set()  # as if `c` were pressed during this multiply
            return multiply(a, b)

        return counted

    monkeypatch.setattr(jobs.matmul, "make_multiply", counting_make_multiply)
    result = run_job(
        "matmul", on_event=lambda run, event: current.setdefault("run", run), m=32, k=32, n=32, repeats=1000, warmup=0
    )
    assert result.status == "cancelled"
    assert len(calls) == 3  # not the 1000 repeats, nor the other seven devices
    assert result.tables() == []
    assert any(line == "cancelled after 0 of 8 devices" for line in result.logs())


def test_the_memory_guard_admits_what_fits_and_refuses_a_byte_less(runtime):
    from jobs.matmul import check_memory, host_memory_needed

    params = get_job("matmul").resolve({"m": "8192", "k": "8192", "n": "8192"})
    needed = host_memory_needed(params, devices_share_host_memory=True)
    # At least A, B and the float64 reference and product of 8192² values each.
    assert needed >= 8192 * 8192 * (4 + 4 + 8 + 8)
    check_memory(params, runtime, available_host=needed)
    with pytest.raises(ParamError) as raised:
        check_memory(params, runtime, available_host=needed - 1)
    assert "m=8192, k=8192, n=8192 (float32) needs 3.8 GiB of host memory" in str(raised.value)
