"""A profile asked for and answered over the bus: request and answer objects inside a run.

Whoever wants a profile of a live run (the dashboard, ``tpudash profile``)
writes a request, ``<run>/profile/requests/<id>.json``; the run's writer
(``tpudash.profiles.capture.ProfileResponder``) picks it up, profiles the
next N steps and answers in ``<run>/profile/answers/<id>.json``, replacing
the answer whole as its state changes (capturing, then done or failed).
Both go through the run's ``RunFiles``, so a run in a bucket is asked and
answered the same way as one on this host's disk.

Both kinds of object are untrusted input (any process may write into a run):
each is read capped, its id must be a plain name equal to its file's name,
numbers must be whole and in range, text bounded; a bad one is skipped, and
``scan_requests``/``scan_answers`` name why.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any, TypeGuard

from tpudash.runs.backends import RunFiles

DEFAULT_PROFILE_STEPS = 5
MAX_PROFILE_STEPS = 1000
# A worker's index in a cluster: as many as a run's heartbeats are read for (``tpudash.runs.workers``).
MAX_PROFILE_WORKER = 4095
PROFILE_FOLDER = "profile"
REQUESTS_FOLDER = f"{PROFILE_FOLDER}/requests"
ANSWERS_FOLDER = f"{PROFILE_FOLDER}/answers"
# Where captures land: XProf's and TensorBoard's layout under the logdir ``<run>/profile``.
CAPTURES_FOLDER = f"{PROFILE_FOLDER}/plugins/profile"
# A request or an answer is a few hundred bytes; anything larger was not written by tpudash.
MAX_PROFILE_OBJECT_BYTES = 64 * 1024
# How many request (or answer) files one scan reads: the newest, by their sortable ids.
MAX_PROFILE_OBJECTS_READ = 256
MAX_PROFILE_TEXT = 256
MAX_REASON_TEXT = 2000
MAX_STEP_NUMBER = 2**53
# Timestamps any formatter accepts (as ``jobs.events``): 1970 to 9999.
MAX_TIMESTAMP = 253_402_128_000.0
STATE_CAPTURING = "capturing"
STATE_DONE = "done"
STATE_FAILED = "failed"
ANSWER_STATES = (STATE_CAPTURING, STATE_DONE, STATE_FAILED)
FINAL_STATES = (STATE_DONE, STATE_FAILED)
FRAMEWORKS = ("tensorflow", "jax")
# A request id or a capture folder: a plain name (no '/', not hidden, never '..'), as run ids are.
PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,79}")
PLAIN_NAME_RULE = "a plain name of 1 to 80 letters, digits, '_', '.' or '-', starting with a letter or digit"


def is_plain_name(name: object) -> bool:
    """Whether ``name`` may name a request or a capture folder inside a run (never a path, never hidden)."""
    return isinstance(name, str) and PLAIN_NAME.fullmatch(name) is not None


def new_request_id(now: float | None = None) -> str:
    """``20261128T070554-1a2b3c``: sortable by when it was asked, unique."""
    stamp = datetime.fromtimestamp(time.time() if now is None else now, tz=timezone.utc)
    return f"{stamp:%Y%m%dT%H%M%S}-{secrets.token_hex(3)}"


def requester() -> str:
    """``host:pid``: who asked, as a request names it."""
    return f"{socket.gethostname()}:{os.getpid()}"[:MAX_PROFILE_TEXT]


@dataclass(frozen=True)
class ProfileRequest:
    """A profile asked of a run's writer: the next ``steps`` steps, by ``worker`` (None: the chief)."""

    id: str
    steps: int
    worker: int | None
    requested_at: float
    requested_by: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, payload: object) -> ProfileRequest:
        """A request from its JSON object; ValueError naming the first field that is wrong and what it may be."""
        if not isinstance(payload, dict):
            raise ValueError("a request is a JSON object")
        return cls(
            id=_name(payload, "id"),
            steps=checked_steps(payload.get("steps", DEFAULT_PROFILE_STEPS)),
            worker=checked_worker(payload.get("worker")),
            requested_at=_time(payload, "requested_at"),
            requested_by=_text(payload, "requested_by", MAX_PROFILE_TEXT),
        )


@dataclass(frozen=True)
class ProfileAnswer:
    """A writer's answer to a request: capturing, done (which steps, where) or failed (why)."""

    id: str
    state: str
    reason: str | None
    capture: str | None
    first_step: int | None
    last_step: int | None
    host: str
    worker: int
    framework: str
    answered_at: float
    capture_seconds: float | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, payload: object) -> ProfileAnswer:
        """An answer from its JSON object; ValueError naming the first field that is wrong and what it may be."""
        if not isinstance(payload, dict):
            raise ValueError("an answer is a JSON object")
        state = payload.get("state")
        if state not in ANSWER_STATES:
            raise ValueError(f"state: {state!r:.40} is not one of {', '.join(ANSWER_STATES)}")
        framework = payload.get("framework")
        if framework not in FRAMEWORKS:
            raise ValueError(f"framework: {framework!r:.40} is not one of {', '.join(FRAMEWORKS)}")
        capture = payload.get("capture")
        if capture is not None and not is_plain_name(capture):
            raise ValueError(f"capture: {capture!r:.40} is not {PLAIN_NAME_RULE}")
        first_step = _optional_step(payload, "first_step")
        last_step = _optional_step(payload, "last_step")
        if first_step is not None and last_step is not None and last_step < first_step:
            raise ValueError(f"last_step: {last_step} is before first_step {first_step}")
        seconds = payload.get("capture_seconds")
        if seconds is not None and not (_is_number(seconds) and 0 <= seconds <= MAX_TIMESTAMP):
            raise ValueError(f"capture_seconds: {seconds!r:.40} is not a number of seconds ≥ 0")
        worker = checked_worker(payload.get("worker"))
        if worker is None:
            raise ValueError("worker: an answer names the worker that wrote it (0 for the chief)")
        return cls(
            id=_name(payload, "id"),
            state=str(state),
            reason=_optional_text(payload, "reason", MAX_REASON_TEXT),
            capture=capture,
            first_step=first_step,
            last_step=last_step,
            host=_text(payload, "host", MAX_PROFILE_TEXT),
            worker=worker,
            framework=str(framework),
            answered_at=_time(payload, "answered_at"),
            capture_seconds=None if seconds is None else float(seconds),
        )


def checked_steps(steps: object) -> int:
    """``steps`` if a request may ask for that many, else ValueError naming the field and the range."""
    if not _is_whole(steps) or not 1 <= steps <= MAX_PROFILE_STEPS:
        raise ValueError(f"steps: {steps!r:.40} is not allowed; a profile covers 1 to {MAX_PROFILE_STEPS} steps")
    return int(steps)


def checked_worker(worker: object) -> int | None:
    """``worker`` if it may name a worker (None: the chief), else ValueError naming the field and the range."""
    if worker is None:
        return None
    if not _is_whole(worker) or not 0 <= worker <= MAX_PROFILE_WORKER:
        raise ValueError(
            f"worker: {worker!r:.40} is not allowed; a worker is an index 0 to {MAX_PROFILE_WORKER} (0 is the chief)"
        )
    return int(worker)


def request_profile(files: RunFiles, steps: int = DEFAULT_PROFILE_STEPS, worker: int | None = None) -> ProfileRequest:
    """Ask the run's writer (``worker``'s; None: the chief's) for a profile of its next ``steps`` steps.

    Writes ``profile/requests/<id>.json`` and returns the request; its answer
    comes in ``profile/answers/<id>.json`` (``wait_for_answer``). ValueError
    naming the field for a bad ``steps`` or ``worker``.
    """
    now = time.time()
    request = ProfileRequest(
        id=new_request_id(now),
        steps=checked_steps(steps),
        worker=checked_worker(worker),
        requested_at=now,
        requested_by=requester(),
    )
    files.write(f"{REQUESTS_FOLDER}/{request.id}.json", _json_bytes(request.to_json()))
    return request


def scan_requests(files: RunFiles) -> tuple[list[ProfileRequest], list[str]]:
    """The run's checked requests, oldest first, and one problem line per file that is no request."""
    found, problems = _scan(files, REQUESTS_FOLDER, ProfileRequest.from_json)
    requests = [request for request in found if isinstance(request, ProfileRequest)]
    return sorted(requests, key=lambda request: (request.requested_at, request.id)), problems


def read_requests(files: RunFiles) -> list[ProfileRequest]:
    """The run's requests, checked, oldest first; a file that is no request is skipped."""
    return scan_requests(files)[0]


def scan_answers(files: RunFiles) -> tuple[list[ProfileAnswer], list[str]]:
    """The run's checked answers, oldest first, and one problem line per file that is no answer."""
    found, problems = _scan(files, ANSWERS_FOLDER, ProfileAnswer.from_json)
    return [answer for answer in found if isinstance(answer, ProfileAnswer)], problems


def read_answers(files: RunFiles) -> list[ProfileAnswer]:
    """The run's answers, checked, oldest first; a file that is no answer is skipped."""
    return scan_answers(files)[0]


def read_answer(files: RunFiles, request_id: str) -> ProfileAnswer | None:
    """The answer to ``request_id``; None while there is none, or when what is there is no answer to it."""
    if not is_plain_name(request_id):
        return None
    try:
        found = _read_object(files, f"{ANSWERS_FOLDER}/{request_id}.json", request_id, ProfileAnswer.from_json)
    except (OSError, ValueError):
        return None
    return found if isinstance(found, ProfileAnswer) else None


def load_request(files: RunFiles, request_id: str) -> ProfileRequest:
    """The request ``request_id``, checked: OSError when it cannot be read, ValueError naming what is wrong."""
    if not is_plain_name(request_id):
        raise ValueError(f"the file's name is not {PLAIN_NAME_RULE}")
    found = _read_object(files, f"{REQUESTS_FOLDER}/{request_id}.json", request_id, ProfileRequest.from_json)
    assert isinstance(found, ProfileRequest)
    return found


def write_answer(files: RunFiles, answer: ProfileAnswer) -> None:
    """Replace the answer to ``answer.id`` whole (a reader sees the old one or the new one, never half)."""
    if not is_plain_name(answer.id):
        raise ValueError(f"id: {answer.id!r:.40} is not {PLAIN_NAME_RULE}")
    files.write(f"{ANSWERS_FOLDER}/{answer.id}.json", _json_bytes(answer.to_json()))


def wait_for_answer(
    files: RunFiles,
    request_id: str,
    *,
    until_state: Iterable[str] = FINAL_STATES,
    timeout: float,
    poll: float = 0.5,
    stop: threading.Event | None = None,
) -> ProfileAnswer | None:
    """The answer to ``request_id`` once its state is one of ``until_state``, read every ``poll`` seconds.

    At ``timeout`` (or when ``stop`` is set) the latest answer read, whatever
    its state (the caller reads ``state`` to tell), or None if there was none.
    """
    wanted = tuple(until_state)
    waiting = stop if stop is not None else threading.Event()
    deadline = time.monotonic() + timeout
    latest: ProfileAnswer | None = None
    while True:
        latest = read_answer(files, request_id) or latest
        if latest is not None and latest.state in wanted:
            return latest
        left = deadline - time.monotonic()
        if left <= 0 or waiting.wait(min(poll, left)):
            return read_answer(files, request_id) or latest


def _scan(files: RunFiles, folder: str, parse: Any) -> tuple[list[Any], list[str]]:
    names = sorted(name for name in files.list(folder) if name.endswith(".json"))
    problems: list[str] = []
    if len(names) > MAX_PROFILE_OBJECTS_READ:
        problems.append(f"{folder}/: {len(names):,} files; the newest {MAX_PROFILE_OBJECTS_READ} were read")
        names = names[-MAX_PROFILE_OBJECTS_READ:]
    found: list[Any] = []
    for name in names:
        stem = name[: -len(".json")]
        try:
            if not is_plain_name(stem):
                raise ValueError(f"the file's name is not {PLAIN_NAME_RULE}")
            found.append(_read_object(files, f"{folder}/{name}", stem, parse))
        except FileNotFoundError:
            continue  # removed since the listing
        except (OSError, ValueError) as error:
            problems.append(f"{folder}/{name}: {error}; skipped")
    return found, problems


def _read_object(files: RunFiles, name: str, expected_id: str, parse: Any) -> Any:
    data = files.read(name, MAX_PROFILE_OBJECT_BYTES)
    try:
        payload = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None
    except (json.JSONDecodeError, RecursionError) as error:
        raise ValueError(f"not JSON ({str(error):.80})") from None
    found = parse(payload)
    if found.id != expected_id:
        raise ValueError(f"id: {found.id!r:.40} differs from the file's name")
    return found


def _json_bytes(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, sort_keys=True).encode("utf-8")


def _is_whole(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _name(payload: dict, field: str) -> str:
    value = payload.get(field)
    if not is_plain_name(value):
        raise ValueError(f"{field}: {value!r:.40} is not {PLAIN_NAME_RULE}")
    return str(value)


def _text(payload: dict, field: str, limit: int) -> str:
    value = payload.get(field)
    if not isinstance(value, str) or not value or len(value) > limit:
        raise ValueError(f"{field}: {value!r:.40} is not text of 1 to {limit} characters")
    return value


def _optional_text(payload: dict, field: str, limit: int) -> str | None:
    return None if payload.get(field) is None else _text(payload, field, limit)


def _time(payload: dict, field: str) -> float:
    value = payload.get(field)
    if not _is_number(value) or not 0 <= value <= MAX_TIMESTAMP:
        raise ValueError(f"{field}: {value!r:.40} is not a unix time between 1970 and 9999")
    return float(value)


def _optional_step(payload: dict, field: str) -> int | None:
    value = payload.get(field)
    if value is None:
        return None
    if not _is_whole(value) or not 0 <= value <= MAX_STEP_NUMBER:
        raise ValueError(f"{field}: {value!r:.40} is not a step number 0 to 2**53")
    return int(value)
