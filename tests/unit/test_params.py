"""Param parsing and validation: every bad value names the field and what is allowed."""

from __future__ import annotations

import pytest

from jobs.base import JobSpec, Param, ParamError, parse_assignments


def _spec(**kwargs) -> JobSpec:
    params = (
        Param("steps", "int", 20, "optimisation steps", minimum=1, maximum=10_000),
        Param("learning_rate", "float", 0.1, "step size", minimum=0, minimum_exclusive=True),
        Param("optimizer", "str", "sgd", "update rule", choices=("sgd", "momentum", "adam")),
        Param("start", "floats", (1.0, 4.0), "start point", length=2),
        Param("deterministic", "bool", False, "op determinism"),
    )
    return JobSpec(name="demo", title="Demo", description="a demo job", params=params, run=lambda ctx, p: {}, **kwargs)


def test_defaults_resolve_to_typed_values():
    assert _spec().resolve({}) == {
        "steps": 20,
        "learning_rate": 0.1,
        "optimizer": "sgd",
        "start": (1.0, 4.0),
        "deterministic": False,
    }


def test_text_overrides_are_converted_like_the_cli_types_them():
    params = _spec().resolve({"steps": "5", "learning_rate": "1e-3", "start": "0.5, -2", "deterministic": "yes"})
    assert params["steps"] == 5
    assert params["learning_rate"] == pytest.approx(1e-3)
    assert params["start"] == (0.5, -2.0)
    assert params["deterministic"] is True


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("steps", "ten", "not an integer"),
        ("steps", "2.5", "not an integer"),
        ("steps", "0", "out of range; allowed: an integer >= 1 and <= 10000"),
        ("steps", "10001", "out of range"),
        ("steps", "", "is empty"),
        ("learning_rate", "0", "allowed: a number > 0"),
        ("learning_rate", "-1", "out of range"),
        ("learning_rate", "nan", "not a finite number"),
        ("learning_rate", "inf", "not a finite number"),
        ("optimizer", "rmsprop", "allowed: one of sgd, momentum, adam"),
        ("start", "1", "needs 2 values, got 1"),
        ("start", "1,x", "not comma-separated numbers"),
        ("deterministic", "maybe", "not true/false, yes/no, on/off, 1/0 (any case)"),
    ],
)
def test_bad_values_name_the_field_and_what_is_allowed(name, value, expected):
    with pytest.raises(ParamError) as caught:
        _spec().resolve({name: value})
    assert caught.value.field == name
    assert str(caught.value).startswith(f"{name}: ")
    assert expected in str(caught.value)


def test_unknown_param_lists_the_known_ones():
    with pytest.raises(ParamError) as caught:
        _spec().resolve({"stepz": "3"})
    assert "unknown param for job 'demo'" in str(caught.value)
    assert "steps, learning_rate, optimizer, start, deterministic" in str(caught.value)


def test_cross_field_rule_runs_after_each_field_is_valid():
    def no_adam_with_many_steps(params):
        if params["optimizer"] == "adam" and params["steps"] > 100:
            raise ParamError("steps", "adam is limited to 100 steps")

    spec = _spec(check_params=no_adam_with_many_steps)
    assert spec.resolve({"optimizer": "adam", "steps": "100"})["steps"] == 100
    with pytest.raises(ParamError, match="adam is limited"):
        spec.resolve({"optimizer": "adam", "steps": "101"})


def test_assignments_need_a_name_and_an_equals_sign():
    assert parse_assignments(["steps=5", "start=1,4", "name=a=b"]) == {"steps": "5", "start": "1,4", "name": "a=b"}
    with pytest.raises(ParamError, match="expected NAME=VALUE"):
        parse_assignments(["steps"])
    with pytest.raises(ParamError, match="expected NAME=VALUE"):
        parse_assignments(["=5"])


def test_describe_shows_defaults_as_the_user_would_type_them():
    described = _spec().describe()
    start = next(param for param in described["params"] if param["name"] == "start")
    assert start["default"] == "1,4"
    assert start["allowed"] == "comma-separated numbers (2 of them)"
    optimizer = next(param for param in described["params"] if param["name"] == "optimizer")
    assert optimizer["choices"] == ["sgd", "momentum", "adam"]


@pytest.mark.parametrize(
    ("spelling", "expected"),
    [
        ("true", True),
        ("True", True),
        ("YES", True),
        ("on", True),
        ("1", True),
        ("false", False),
        ("No", False),
        ("OFF", False),
        ("0", False),
    ],
)
def test_a_bool_takes_the_documented_spellings_in_any_case(spelling, expected):
    assert _spec().resolve({"deterministic": spelling})["deterministic"] is expected


@pytest.mark.parametrize("spelling", ["y", "n", "t", "enabled", "2", "yess"])
def test_any_other_bool_spelling_is_refused_naming_every_accepted_one(spelling):
    with pytest.raises(ParamError) as caught:
        _spec().resolve({"deterministic": spelling})
    assert str(caught.value) == f"deterministic: {spelling!r} is not true/false, yes/no, on/off, 1/0 (any case)"


def test_a_mistyped_param_name_gets_the_closest_one_suggested():
    with pytest.raises(ParamError) as caught:
        _spec().resolve({"lerning_rate": "0.1"})
    assert str(caught.value).endswith("; did you mean 'learning_rate'?")
    with pytest.raises(ParamError) as caught:
        _spec().resolve({"Optimiser": "adam"})
    assert str(caught.value).endswith("; did you mean 'optimizer'?")
    with pytest.raises(ParamError) as caught:
        _spec().resolve({"colour": "red"})
    assert "did you mean" not in str(caught.value)
