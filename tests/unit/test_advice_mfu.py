"""MFU's parts: the TPU peak table, the peak the matmul check measured, FLOPs per step on TensorFlow, the result type."""

from __future__ import annotations

import json

import pytest

from tpudash.advice import flops as flops_module
from tpudash.advice.flops import FlopsCount, cost_analysis_flops, hlo_matmul_flops, step_flops_keras_tf
from tpudash.advice.mfu import TPU_PEAKS, Mfu, PeakFlops, measured_peak_flops, mfu, tpu_chips, tpu_peak_flops

# -- the TPU table -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device_kind", "tflops_per_chip"),
    [
        # JAX's device_kind strings
        ("TPU v2", 45),
        ("TPU v3", 123),
        ("TPU v4", 275),
        ("TPU v5 lite", 197),
        ("TPU v5", 459),  # JAX names a v5p "TPU v5"
        ("TPU v5p", 459),
        ("TPU v6 lite", 918),
        # tpu-info's chip types (tpudash.accel.hostcheck.Chips.chip_type) and Cloud's accelerator types
        ("TPU v5e chip", 197),
        ("TPU v6e chip", 918),
        ("v5litepod-8", 197),
        ("v3-8", 123),
    ],
)
def test_each_generation_has_its_published_bf16_peak_per_chip_times_the_chips(device_kind, tflops_per_chip):
    peak = tpu_peak_flops(device_kind, chips=4)
    assert peak.flops_per_second == tflops_per_chip * 1e12 * 4
    assert "× 4 chips" in peak.source and "bf16" in peak.source
    assert "https://" in peak.source  # where the figure comes from, for whoever doubts it


def test_the_table_cites_a_source_for_every_generation_the_issue_names():
    assert set(TPU_PEAKS) == {"v2", "v3", "v4", "v5e", "v5p", "v6e"}
    for peak in TPU_PEAKS.values():
        assert peak.url.startswith("https://") and peak.published


@pytest.mark.parametrize("device_kind", ["TPU7x", "TPU v4 lite", "cpu", "NVIDIA A100-SXM4-40GB", "", None])
def test_an_unknown_kind_has_no_peak_and_says_why(device_kind):
    peak = tpu_peak_flops(device_kind, chips=8)
    assert peak.flops_per_second is None and not peak.known
    assert repr(device_kind) in peak.source and "v6e" in peak.source


def test_a_chip_count_that_is_not_positive_is_refused_with_why():
    peak = tpu_peak_flops("TPU v4", chips=0)
    assert peak.flops_per_second is None and "chip count 0" in peak.source


def test_v2_and_v3_show_two_devices_per_chip_the_others_one():
    assert tpu_chips("TPU v3", 8) == 4  # a v3-8: 8 TensorCores as devices, 4 chips
    assert tpu_chips("TPU v2", 8) == 4
    assert tpu_chips("TPU v4", 4) == 4  # megacore: one device per chip
    assert tpu_chips("TPU v5 lite", 8) == 8


# -- the measured peak -------------------------------------------------------------------------------

CPUS = [f"/job:localhost/replica:0/task:0/device:CPU:{index}" for index in range(4)]


def test_the_last_matmul_check_gives_the_host_peak_with_its_run_and_date(run_job, store):
    result = run_job("matmul", m=64, k=64, n=64, repeats=2)
    assert result.status == "done"
    gflops = result.summary["gflops"]
    peak = measured_peak_flops(store)
    # The check times one logical CPU device at a time, each with all the host's cores: the fastest is the host's.
    assert peak.flops_per_second == pytest.approx(max(gflops.values()) * 1e9)
    [info] = store.list_runs()
    assert peak.source.startswith(f"measured by the matmul check of {info.run_id}, ")
    assert "UTC" in peak.source and "logical CPU devices" in peak.source
    # The same from the run's record and from the dashboard's device check.
    assert measured_peak_flops(info) == peak
    assert measured_peak_flops(info.to_dict()) == peak
    assert measured_peak_flops(store, host="another-host").flops_per_second is None


def test_no_matmul_check_says_how_to_get_one(store):
    peak = measured_peak_flops(store)
    assert peak.flops_per_second is None
    assert "no matmul check" in peak.source and "tpudash run matmul" in peak.source


def test_only_devices_that_passed_count_and_gpus_add_up():
    check = {
        "run_id": "20261128-0900-matmul",
        "finished": 1_795_856_400.0,
        "results": {
            "/device:GPU:0": {"passed": True, "gflops": 1000.0},
            "/device:GPU:1": {"passed": True, "gflops": 900.0},
            "/device:GPU:2": {"passed": False, "gflops": 5000.0},  # a wrong product does not count
        },
    }
    peak = measured_peak_flops(check)
    assert peak.flops_per_second == pytest.approx(1.9e12)
    assert "20261128-0900-matmul, 2026-11-28 " in peak.source and "sum over 2 devices" in peak.source


def test_a_summary_with_failed_devices_counts_only_the_others():
    record = {
        "run_id": "r1",
        "finished": None,
        "summary": {"gflops": {CPUS[0]: 50.0, CPUS[1]: 80.0}, "failed_devices": [CPUS[1]]},
    }
    peak = measured_peak_flops(record)
    assert peak.flops_per_second == pytest.approx(50e9) and "undated" in peak.source


def test_a_run_that_is_no_matmul_check_has_no_peak():
    assert measured_peak_flops({"run_id": "r2", "summary": {"loss": 1.0}}).flops_per_second is None
    assert measured_peak_flops(42).source == "not a matmul check: int"


# -- MFU and its record --------------------------------------------------------------------------------


def test_mfu_is_flops_times_steps_per_second_over_the_peak():
    peak = PeakFlops(1e12, "a peak")
    assert mfu(2e9, 100.0, peak) == pytest.approx(0.2)
    assert mfu(2e9, 100.0, 1e12) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="peak is unknown: no TPU"):
        mfu(2e9, 100.0, PeakFlops(None, "no TPU"))
    with pytest.raises(ValueError, match="flops_per_step"):
        mfu(float("nan"), 1.0, peak)


def test_the_result_carries_both_sources_and_round_trips_through_json():
    result = Mfu.of(FlopsCount(2e9, "XLA"), 50.0, PeakFlops(1e12, "TPU v4 published"))
    assert result.mfu == pytest.approx(0.1) and result.text() == "MFU 10 %"
    stored = json.loads(json.dumps(result.to_json()))
    assert stored["mfu"] == pytest.approx(0.1) and stored["peak_source"] == "TPU v4 published"
    assert Mfu.from_json(stored) == result


def test_an_unknown_part_leaves_mfu_unknown_with_every_reason():
    result = Mfu.of(FlopsCount(None, "JAX could not compile"), None, PeakFlops(None, "no peak for 'TPU7x'"))
    assert result.mfu is None
    assert "JAX could not compile" in result.why and "TPU7x" in result.why and "no steps timed" in result.why
    assert result.text().startswith("MFU unknown (")
    assert Mfu.from_json(result.to_json()) == result


@pytest.mark.parametrize(
    "stored",
    [[], {"mfu": "12 %"}, {"mfu": -0.5}, {"mfu": float("inf")}, {"mfu": True}, {"mfu": 0.1, "peak_source": 7}],
)
def test_a_damaged_record_is_refused_naming_what(stored):
    with pytest.raises(ValueError):
        Mfu.from_json(stored)


# -- counting an HLO module (no TensorFlow) ------------------------------------------------------------

DOT_AND_CONVOLUTIONS = """
HloModule step

ENTRY %main (x: f32[8,32], w: f32[32,16], image: f32[1,4,4,1], kernel: f32[3,3,1,1], grad: f32[1,2,2,1]) -> f32[8,16] {
  %x = f32[8,32]{1,0} parameter(0)
  %w = f32[32,16]{1,0} parameter(1)
  %image = f32[1,4,4,1]{3,2,1,0} parameter(2)
  %kernel = f32[3,3,1,1]{3,2,1,0} parameter(3)
  %grad = f32[1,2,2,1]{3,2,1,0} parameter(4)
  %forward = f32[1,2,2,1]{3,2,1,0} convolution(%image, %kernel), window={size=3x3}, dim_labels=b01f_01io->b01f
  %input_grad = f32[1,4,4,1]{3,2,1,0} convolution(%grad, %kernel), window={size=3x3 pad=2_2x2_2}, dim_labels=b01f_01io->b01f
  %relu = f32[8,32]{1,0} maximum(%x, %x)
  %dot = f32[8,16]{1,0} dot(f32[8,32]{1,0} %relu, f32[32,16]{1,0} %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %outputs = (f32[8,16]{1,0}, f32[1,2,2,1]{3,2,1,0}, f32[1,4,4,1]{3,2,1,0}) tuple(%dot, %forward, %input_grad)
}
"""


def test_hlo_dots_and_convolutions_count_two_flops_per_multiply_add_and_skip_padding():
    dot = 2 * 8 * 32 * 16
    forward = 2 * (2 * 2) * (3 * 3)  # a 2×2 output, a 3×3 window
    # The input's gradient convolves the padded 2×2 gradient: only the window positions on real values count,
    # so it costs what the forward pass does (the padding's multiply-adds are not work).
    assert hlo_matmul_flops(DOT_AND_CONVOLUTIONS) == dot + forward + forward


def test_products_the_steps_outputs_do_not_depend_on_are_not_counted():
    # As lowered from a TensorFlow graph, before XLA's dead-code pass: the first layer's input gradient is
    # computed by the gradient op and read by nothing.
    unread = DOT_AND_CONVOLUTIONS.replace("tuple(%dot, %forward, %input_grad)", "tuple(%dot, %forward, %forward)")
    assert hlo_matmul_flops(unread) == 2 * 8 * 32 * 16 + 2 * (2 * 2) * (3 * 3)


def test_hlo_with_tiled_layouts_is_read_and_an_unreadable_product_is_an_error_not_a_zero():
    tiled = "ROOT %dot = bf16[8,16]{1,0:T(8,128)(2,1)} dot(bf16[8,32]{1,0:T(8,128)(2,1)} %a, bf16[32,16]{1,0:T(8,128)(2,1)} %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}"
    assert hlo_matmul_flops(tiled) == 2 * 8 * 32 * 16
    with pytest.raises(ValueError, match="cannot read the shapes of dot"):
        hlo_matmul_flops("%dot = f32[8,16]{1,0} dot(%unknown, %names), lhs_contracting_dims={1}")


def test_cost_analysis_is_read_as_a_dict_or_a_list_of_dicts():
    assert cost_analysis_flops({"flops": 10.0, "bytes accessed": 4.0}) == 10.0
    assert cost_analysis_flops([{"flops": 10.0}, {"flops": 5.0}]) == 15.0
    assert cost_analysis_flops({"bytes accessed": 4.0}) is None
    assert cost_analysis_flops(None) is None


# -- the cifar-cnn on TensorFlow ------------------------------------------------------------------------


def cifar_cnn_train_flops_by_hand(batch: int) -> int:
    """The cifar-cnn (jobs/models.py) on 32×32×3 images: 2 FLOPs per multiply-add of its convolutions and Dense layers.

    Forward per example: Conv 3→32 (30×30 out), Conv 32→64 (13×13), Conv 64→128 (4×4), Dense 2048→64, Dense 64→10.
    Backward: the weights' gradients cost the forward pass again, the inputs' gradients too, except the first
    convolution's (the images need none). So 3 × forward − the first convolution.
    """
    convolutions = [30 * 30 * 32 * (3 * 3 * 3), 13 * 13 * 64 * (3 * 3 * 32), 4 * 4 * 128 * (3 * 3 * 64)]
    dense = [2048 * 64, 64 * 10]
    forward = 2 * (sum(convolutions) + sum(dense))
    return batch * (3 * forward - 2 * convolutions[0])


def test_cifar_cnn_flops_per_step_are_the_hand_count_under_the_8_device_strategy(runtime, xla_on_the_host):
    from jobs.models import build_model, parameter_count

    with runtime.strategy.scope():
        model = build_model("cifar-cnn", (32, 32, 3), 10)
    assert parameter_count(model) == 225_034
    count = step_flops_keras_tf(model, batch_size=64)  # the global batch: 8 per replica
    # XLA's dot and convolution FLOPs are the multiply-adds counted by hand, exactly: the same ops, 2 per multiply-add.
    assert count.flops == cifar_cnn_train_flops_by_hand(64) == 1_898_790_912
    assert count.source.startswith("XLA's HLO of the step")


def test_without_xla_the_graph_float_ops_count_and_say_so(runtime, xla_on_the_host, monkeypatch):
    from jobs.models import build_model

    model = build_model("cifar-cnn", (32, 32, 3), 10)

    def no_xla(hlo: str) -> int:
        raise RuntimeError("XLA is not available")

    monkeypatch.setattr(flops_module, "hlo_matmul_flops", no_xla)
    count = step_flops_keras_tf(model, batch_size=8)
    assert (
        count.source.startswith("the graph's float-op count") and "RuntimeError: XLA is not available" in count.source
    )
    # TensorFlow's registered formulas count every convolution's two gradients at its input's size, the first
    # one's input gradient included (pruned when the step runs): more than the work done, by less than half.
    hand = cifar_cnn_train_flops_by_hand(8)
    assert count.flops is not None and hand < count.flops < 1.5 * hand


def test_a_model_without_known_inputs_has_no_count_and_says_why():
    import keras

    count = step_flops_keras_tf(keras.Sequential([keras.layers.Dense(4)]), batch_size=8)
    assert count.flops is None and "no known inputs" in count.source
