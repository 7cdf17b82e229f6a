"""The advice rules that need no TensorFlow: each fires on a pitfall and stays quiet without it."""

from __future__ import annotations

import pytest

from tpudash.advice.rules import (
    RULE_IDS,
    Advice,
    advise,
    input_bound,
    mixed_precision,
    padding,
    recompiles,
    small_batch,
)

MLP_1000 = [(784, 1000), (1000,), (1000, 10), (10,)]


def test_padding_fires_for_dense_1000_batch_100_with_hand_counted_share() -> None:
    advice = padding(MLP_1000, batch_per_core=100, on_tpu=False)
    # By hand: batch 100 -> 104, 784 -> 896, 1000 -> 1024, 10 -> 128.
    real = 100 * 784 * 1000 + 100 * 1000 * 10
    padded = 104 * 896 * 1024 + 104 * 1024 * 128
    assert advice.state == "fires"
    assert advice.detail["wasted_percent"] == round(100 * (padded - real) / padded, 1) == 27.2
    assert "would waste 27 % of the matrix unit on a TPU" in advice.summary
    assert advice.detail["dims_not_128"] == [10, 784, 1000]


def test_padding_quiet_when_aligned_and_not_checked_without_batch() -> None:
    assert padding([(1024, 1024), (1024, 128)], 128, on_tpu=True).state == "quiet"
    assert padding(MLP_1000, None, on_tpu=True).state == "not checked"
    assert padding([(10,)], 128, on_tpu=True).state == "not checked"


def test_small_batch() -> None:
    fired = small_batch(100, on_tpu=False)
    assert fired.state == "fires" and "would underfeed a TPU core" in fired.summary
    assert small_batch(128, on_tpu=True).state == "quiet"


def test_mixed_precision() -> None:
    assert mixed_precision("float32", on_tpu=True).state == "fires"
    assert "mixed_bfloat16" in mixed_precision("float32", on_tpu=True).fix
    assert mixed_precision("mixed_bfloat16", on_tpu=True).state == "quiet"
    assert mixed_precision("float32", on_tpu=False).state == "quiet"


def test_input_bound() -> None:
    assert input_bound(None, 62.0).state == "fires"
    assert input_bound(True, None).state == "fires"
    assert input_bound(False, 12.0).state == "quiet"
    assert input_bound(None, None).state == "not checked"


def test_recompiles_fires_with_cause_after_first_epoch() -> None:
    fired = recompiles({"one_step_on_data": 2, "predict": 1}, {"one_step_on_data": ["now f32[16,4], before f32[8,4]"]})
    assert fired.state == "fires"
    assert "one_step_on_data compiled 3 times" in fired.summary
    assert "now f32[16,4]" in fired.summary
    assert recompiles({"one_step_on_data": 0}).state == "quiet"
    assert recompiles(None).state == "not checked"


def test_advise_lists_every_rule_once() -> None:
    listed = advise([small_batch(100, on_tpu=False)])
    assert [a.rule for a in listed] == list(RULE_IDS)
    assert sum(a.state == "not checked" for a in listed) == len(RULE_IDS) - 1


def test_json_round_trip_and_untrusted_input_rejected() -> None:
    advice = padding(MLP_1000, 100, on_tpu=True)
    assert Advice.from_json(advice.to_json()) == advice
    for bad in (
        [],
        {"rule": "nope", "state": "fires"},
        {"rule": "cache", "state": "loud"},
        {"rule": "cache", "state": "quiet", "summary": 3},
        {"rule": "cache", "state": "quiet", "detail": []},
    ):
        with pytest.raises(ValueError):
            Advice.from_json(bad)
