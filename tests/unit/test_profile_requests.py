"""Profile requests and answers on the bus (``tpudash.profiles.requests``): asked, answered, read back checked.

Requests and answers are written by other processes (any process may write
into a run), so every read checks them: a bad one is skipped and named, never
trusted further in. Local runs and bucket runs (``memory://``) alike.
"""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tpudash.profiles.requests import (
    ANSWERS_FOLDER,
    DEFAULT_PROFILE_STEPS,
    MAX_PROFILE_STEPS,
    REQUESTS_FOLDER,
    ProfileAnswer,
    ProfileRequest,
    is_plain_name,
    read_answer,
    read_answers,
    read_requests,
    request_profile,
    scan_answers,
    scan_requests,
    wait_for_answer,
    write_answer,
)
from tpudash.runs.backends import BucketRoot, LocalRunFiles


@pytest.fixture(params=["local", "bucket"])
def files(request, tmp_path):
    if request.param == "local":
        return LocalRunFiles(tmp_path / "20261128-070000-fit-abcdef")
    return BucketRoot(f"memory://profiles-{uuid.uuid4().hex[:8]}/runs").files("20261128-070000-fit-abcdef")


def done_answer(request_id: str, **changes) -> ProfileAnswer:
    fields = dict(
        id=request_id,
        state="done",
        reason=None,
        capture="2026_11_28_07_05_54",
        first_step=6,
        last_step=10,
        host="vm",
        worker=0,
        framework="tensorflow",
        answered_at=time.time(),
        capture_seconds=0.42,
    )
    fields.update(changes)
    return ProfileAnswer(**fields)


def test_a_request_and_its_answer_round_trip(files):
    request = request_profile(files, steps=7, worker=2)
    assert request.steps == 7 and request.worker == 2
    assert read_requests(files) == [request]
    assert read_answer(files, request.id) is None  # not answered yet
    answer = done_answer(request.id, worker=2)
    write_answer(files, answer)
    assert read_answer(files, request.id) == answer
    assert read_answers(files) == [answer]
    # Replaced whole as the state changes.
    write_answer(files, done_answer(request.id, state="failed", reason="the run ended before the profile started"))
    assert read_answer(files, request.id).state == "failed"


def test_a_request_names_who_asked_and_defaults_to_five_steps_of_the_chief(files):
    request = request_profile(files)
    assert (request.steps, request.worker) == (DEFAULT_PROFILE_STEPS, None)
    assert ":" in request.requested_by and abs(request.requested_at - time.time()) < 60
    on_the_bus = json.loads(files.read(f"{REQUESTS_FOLDER}/{request.id}.json", 4096))
    assert set(on_the_bus) == {"id", "steps", "worker", "requested_at", "requested_by"}


def test_request_ids_are_plain_sortable_names():
    from tpudash.profiles.requests import new_request_id

    early, late = new_request_id(1_700_000_000), new_request_id(1_800_000_000)
    assert early < late and is_plain_name(early) and early.startswith("20231114T221320-")


@pytest.mark.parametrize(
    ("steps", "worker", "named"),
    [(0, None, "steps"), (MAX_PROFILE_STEPS + 1, None, "steps"), (True, None, "steps"), (2.5, None, "steps"),
     (5, -1, "worker"), (5, "1", "worker"), (5, 10**6, "worker")],
)  # fmt: skip
def test_a_bad_request_is_refused_naming_the_field_and_what_is_allowed(tmp_path, steps, worker, named):
    files = LocalRunFiles(tmp_path)
    with pytest.raises(ValueError, match=rf"^{named}: .* is not allowed; .*\d"):
        request_profile(files, steps=steps, worker=worker)
    assert read_requests(files) == []  # nothing was written


def test_bad_request_files_are_skipped_and_named(files):
    good = request_profile(files, steps=3)
    bad = {
        "20261128T070000-000001.json": b"{not json",
        "20261128T070000-000002.json": json.dumps({"id": "20261128T070000-000002", "steps": 0}).encode(),
        "20261128T070000-000003.json": json.dumps(
            {**good.to_json(), "id": "20261128T070000-999999"}  # claims another request's id
        ).encode(),
        "20261128T070000-000004.json": json.dumps({**good.to_json(), "id": "..", "steps": 3}).encode(),
        "20261128T070000-000005.json": b"\xff\xfe",
        "20261128T070000-000006.json": json.dumps({**good.to_json(), "id": "20261128T070000-000006"}).encode()
        + b" " * 70_000,  # larger than a request can be
        "20261128T070000-000007.json": json.dumps(
            {**good.to_json(), "id": "20261128T070000-000007", "requested_by": "x" * 10_000}
        ).encode(),
    }
    for name, data in bad.items():
        files.write(f"{REQUESTS_FOLDER}/{name}", data)
    requests, problems = scan_requests(files)
    assert requests == [good]
    assert len(problems) == len(bad)
    said = "\n".join(problems)
    for expected in ("not JSON", "steps: 0 is not allowed", "differs from the file's name", "id: '..'", "UTF-8",
                     "larger than", "requested_by"):  # fmt: skip
        assert expected in said


def test_bad_answers_are_skipped_and_read_answer_says_none(files):
    request = request_profile(files)
    for field, value in [("state", "sleeping"), ("framework", "torch"), ("capture", "../../etc"),
                         ("first_step", -1), ("capture_seconds", float("nan")), ("worker", None)]:  # fmt: skip
        payload = done_answer(request.id).to_json()
        payload[field] = value
        files.write(f"{ANSWERS_FOLDER}/{request.id}.json", json.dumps(payload).encode())
        assert read_answer(files, request.id) is None, field
        answers, problems = scan_answers(files)
        assert answers == [] and field in problems[0]
    assert read_answer(files, "../run.json") is None  # never a path out of the answers folder


def test_wait_for_answer_returns_once_the_state_is_final(tmp_path):
    files = LocalRunFiles(tmp_path)
    request = request_profile(files)
    write_answer(files, done_answer(request.id, state="capturing", capture=None, last_step=None))
    answered = threading.Event()

    def answer_later() -> None:
        # Once the waiter has seen "capturing" (it read it at least once), the writer answers done.
        answered.wait(5)
        write_answer(files, done_answer(request.id))

    writer = threading.Thread(target=answer_later)
    writer.start()
    first = wait_for_answer(files, request.id, until_state=("capturing",), timeout=5, poll=0.01)
    assert first is not None and first.state == "capturing"
    answered.set()
    final = wait_for_answer(files, request.id, timeout=5, poll=0.01)
    writer.join()
    assert final is not None and final.state == "done" and final.capture == "2026_11_28_07_05_54"


def test_wait_for_answer_gives_up_at_its_timeout_with_the_latest_answer(tmp_path):
    files = LocalRunFiles(tmp_path)
    request = request_profile(files)
    assert wait_for_answer(files, request.id, timeout=0.05, poll=0.01) is None
    write_answer(files, done_answer(request.id, state="capturing", capture=None, last_step=None))
    assert wait_for_answer(files, request.id, timeout=0.05, poll=0.01).state == "capturing"
    stop = threading.Event()
    stop.set()
    started = time.monotonic()
    assert wait_for_answer(files, request.id, timeout=60, poll=30, stop=stop).state == "capturing"
    assert time.monotonic() - started < 10  # a set stop ends the wait at once


@given(
    payload=st.dictionaries(
        st.sampled_from(["id", "steps", "worker", "requested_at", "requested_by", "state", "framework", "capture",
                         "first_step", "last_step", "host", "answered_at", "capture_seconds", "reason"]),
        st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=300),
                  st.lists(st.integers(), max_size=3)),
    )
)  # fmt: skip
def test_any_json_object_is_a_checked_request_and_answer_or_a_value_error(payload):
    for kind in (ProfileRequest, ProfileAnswer):
        try:
            parsed = kind.from_json(payload)
        except ValueError as error:
            assert str(error)  # names what is wrong
            continue
        assert is_plain_name(parsed.id)
        # What was accepted goes back to the same JSON, and reads the same again.
        assert kind.from_json(json.loads(json.dumps(parsed.to_json()))) == parsed


@given(steps=st.integers(1, MAX_PROFILE_STEPS), worker=st.one_of(st.none(), st.integers(0, 4095)))
def test_every_allowed_request_reads_back_as_written(tmp_path_factory, steps, worker):
    files = LocalRunFiles(tmp_path_factory.mktemp("run"))
    request = request_profile(files, steps=steps, worker=worker)
    assert read_requests(files) == [request]
