"""summary.json read back (untrusted: every field checked, a bad one named) and a run's captures listed.

No TensorFlow or xprof here: the summaries are written as the converter writes them.
"""

from __future__ import annotations

import copy
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tpudash.profiles.requests import CAPTURES_FOLDER
from tpudash.profiles.summary import (
    MAX_SUMMARY_BYTES,
    ProfileError,
    ProfileSummary,
    capture_time,
    list_captures,
    read_summary,
)
from tpudash.runs.backends import BucketRoot, LocalRunFiles

RUN_ID = "20261128-070000-fit-abcdef"


def summary_payload(capture: str = "2026_11_28_07_05_54") -> dict[str, Any]:
    """A summary as the converter writes it for an input-bound fit on CPU."""
    not_on_cpu = {"percent": None, "note": "not measured on CPU"}
    return {
        "version": 1,
        "capture": capture,
        "hosts": ["vm"],
        "framework": "tensorflow",
        "hardware": "CPU_ONLY",
        "steps": 2,
        "step_time_ms": {"avg": 41.6, "min": 39.4, "max": 43.8, "std": 2.2},
        "per_step": [
            {
                "step": "6",
                "total_ms": 43.8,
                "input_ms": 39.0,
                "host_compute_ms": 4.5,
                "device_compute_ms": 0.0,
                "collectives_ms": 0.0,
                "compile_ms": 0.0,
                "other_ms": 0.3,
            },
            {
                "step": "7",
                "total_ms": 39.4,
                "input_ms": 36.0,
                "host_compute_ms": 3.1,
                "device_compute_ms": 0.0,
                "collectives_ms": 0.0,
                "compile_ms": 0.0,
                "other_ms": 0.3,
            },
        ],
        "breakdown": {
            "input": 90.3,
            "host_compute": 8.9,
            "device_compute": 0.0,
            "collectives": 0.0,
            "compile": 0.0,
            "other": 0.7,
            "idle": 0.1,
        },
        "input_percent": 90.3,
        "verdict": "input-bound",
        "input_conclusion": "Your program is HIGHLY input-bound because 90.3% of the total step time …",
        "bottleneck": "XProf's bottleneck: host",
        "recommendations": ["Look at Section 3 for the breakdown of input time on the host."],
        "utilisation": {
            "duty_cycle": dict(not_on_cpu),
            "mxu": dict(not_on_cpu),
            "flop_rate_vs_roofline": dict(not_on_cpu),
            "memory_bandwidth": dict(not_on_cpu),
        },
        "top_ops": [{"name": "EagerPyFunc", "type": "EagerPyFunc", "self_percent": 23.6, "self_ms": 163.1}],
        "top_ops_source": "xprof framework_op_stats (host)",
        "input_stages": [{"name": "Iterator::Root::Prefetch", "self_ms": 195.3, "self_percent": 37.2}],
        "notes": [],
        "tool": "xprof 2.24.2",
        "convert_seconds": 0.04,
    }


def test_a_summary_comes_back_as_it_was_written() -> None:
    payload = summary_payload()
    summary = ProfileSummary.from_json(json.loads(json.dumps(payload)))
    assert summary.to_json() == payload
    assert list(summary.to_json())[0] == "version"
    assert summary.verdict == "input-bound" and summary.utilisation["mxu"]["percent"] is None


BAD_FIELDS = [
    (("version",), 2, "version"),
    (("capture",), "../../etc", "capture"),
    (("hosts",), ["vm", 3], "hosts[1]"),
    (("hosts",), ["x"] * 65, "hosts"),
    (("framework",), "torch", "framework"),
    (("steps",), -1, "steps"),
    (("steps",), True, "steps"),
    (("step_time_ms", "avg"), float("nan"), "step_time_ms.avg"),
    (("step_time_ms", "max"), "43", "step_time_ms.max"),
    (("per_step", 0, "input_ms"), -3.0, "per_step[0].input_ms"),
    (("breakdown", "input"), 190.0, "breakdown.input"),
    (("breakdown",), {"input": 1.0}, "breakdown.host_compute"),
    (("input_percent",), 101, "input_percent"),
    (("verdict",), "slow", "verdict"),
    (("input_conclusion",), "x" * 5000, "input_conclusion"),
    (("recommendations",), "read the docs", "recommendations"),
    (("utilisation", "mxu"), 4.1, "utilisation.mxu"),
    (("utilisation", "duty_cycle", "percent"), -1, "utilisation.duty_cycle.percent"),
    (("top_ops", 0, "name"), "", "top_ops[0].name"),
    (("top_ops", 0, "self_percent"), None, "top_ops[0].self_percent"),
    (("input_stages", 0, "self_ms"), 1e13, "input_stages[0].self_ms"),
    (("notes",), [None], "notes[0]"),
    (("tool",), 7, "tool"),
    (("convert_seconds",), -0.5, "convert_seconds"),
]


@pytest.mark.parametrize(("path", "value", "named"), BAD_FIELDS, ids=[named for _, _, named in BAD_FIELDS])
def test_a_bad_field_is_refused_by_name(path: tuple, value: object, named: str) -> None:
    payload = summary_payload()
    holder: Any = payload
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = value
    with pytest.raises(ValueError) as refused:
        ProfileSummary.from_json(payload)
    assert str(refused.value).startswith(f"{named}: ")


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=10,
)


def _paths(value: object, prefix: tuple = ()) -> list[tuple]:
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, (*prefix, index))
    return found


@given(data=st.data(), replacement=JSON_VALUES)
def test_any_field_replaced_by_any_json_is_read_or_refused_by_name(data: st.DataObject, replacement: object) -> None:
    payload = summary_payload()
    path = data.draw(st.sampled_from(_paths(payload)))
    changed = copy.deepcopy(payload)
    holder: Any = changed
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = replacement
    try:
        summary = ProfileSummary.from_json(changed)
    except ValueError as error:
        # The message names the field (its top-level name at least) before saying what is wrong.
        assert str(error).split(":", 1)[0].split(".")[0].split("[")[0] == path[0]
    else:
        assert ProfileSummary.from_json(summary.to_json()) == summary


def _write_capture(files: Any, name: str, hosts: list[str], summary: dict | None = None) -> None:
    for host in hosts:
        files.write(f"{CAPTURES_FOLDER}/{name}/{host}.xplane.pb", b"\x0a\x00")
    if summary is not None:
        files.write(f"{CAPTURES_FOLDER}/{name}/summary.json", json.dumps(summary).encode())


def _local_files(tmp_path: Path) -> LocalRunFiles:
    (tmp_path / RUN_ID).mkdir()
    return LocalRunFiles(tmp_path / RUN_ID)


def _bucket_files(tmp_path: Path) -> Any:
    return BucketRoot(f"memory://profile-summaries-{uuid.uuid4().hex[:8]}/runs").files(RUN_ID)


@pytest.mark.parametrize("make_files", [_local_files, _bucket_files], ids=["local", "bucket"])
def test_a_runs_captures_are_listed_newest_first(tmp_path: Path, make_files: Any) -> None:
    files = make_files(tmp_path)
    assert list_captures(files) == []
    _write_capture(files, "2026_11_28_07_05_54", ["vm"], summary_payload("2026_11_28_07_05_54"))
    _write_capture(files, "2026_11_28_08_00_01", ["host-a", "host-b"])
    files.write(f"{CAPTURES_FOLDER}/bad name/vm.xplane.pb", b"")  # not a plain name: not listed
    captures = list_captures(files)
    assert [info.name for info in captures] == ["2026_11_28_08_00_01", "2026_11_28_07_05_54"]
    assert captures[0].hosts == ["host-a", "host-b"] and not captures[0].has_summary
    assert captures[1].hosts == ["vm"] and captures[1].has_summary
    assert captures[1].started_at == time.mktime((2026, 11, 28, 7, 5, 54, 0, 0, -1))
    assert read_summary(files, "2026_11_28_07_05_54") == ProfileSummary.from_json(summary_payload())
    assert read_summary(files, "2026_11_28_08_00_01") is None


def test_a_summary_that_cannot_be_read_is_said_with_its_capture(tmp_path: Path) -> None:
    files = _local_files(tmp_path)
    _write_capture(files, "cap1", ["vm"])
    files.write(f"{CAPTURES_FOLDER}/cap1/summary.json", b"{not json")
    with pytest.raises(ProfileError, match=r"^the summary of capture cap1 is not one tpudash reads: summary: not JSON"):
        read_summary(files, "cap1")
    files.write(f"{CAPTURES_FOLDER}/cap1/summary.json", json.dumps({**summary_payload(), "verdict": 3}).encode())
    with pytest.raises(ProfileError, match=r"reads: verdict: 3 is not one of"):
        read_summary(files, "cap1")
    files.write(f"{CAPTURES_FOLDER}/cap1/summary.json", b" " * (MAX_SUMMARY_BYTES + 1))
    with pytest.raises(ProfileError, match=r"^the summary of capture cap1 could not be read: .*larger than"):
        read_summary(files, "cap1")
    with pytest.raises(ValueError, match=r"^capture: '\.\./cap1' is not a plain name"):
        read_summary(files, "../cap1")


def test_a_capture_named_otherwise_has_no_time() -> None:
    assert capture_time("2026_11_28_07_05_54") == time.mktime((2026, 11, 28, 7, 5, 54, 0, 0, -1))
    assert capture_time("my-capture") is None
