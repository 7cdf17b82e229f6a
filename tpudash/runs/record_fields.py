"""What each field of a run's run.json may hold, and the check a reader makes of each one.

run.json is written by a run's owner, but read as untrusted input (another
process, another host or another user may have written it): each field is
checked here one by one, and a field that breaks its rule is dropped and
named, so one bad field never hides the rest of a run.
"""

from __future__ import annotations

from typing import Any

from jobs.events import MAX_NAME_CHARS, MAX_TEXT_CHARS, is_sane_timestamp, json_size
from tpudash.runs.layout import RUN_FILE
from tpudash.runs.workers import MAX_WORKERS

# A pid as Linux gives them (pid_max is at most 2**22): anything else in run.json is not a process to look at.
MAX_PID = 2**22
# params, summary and final_metrics: values counted through every level.
MAX_RECORD_VALUES = 10_000


def checked_field(meta: dict, name: str, problems: list[str]) -> Any:
    """run.json's ``name`` if it is what the field may hold, else None with the problem named."""
    value = meta.get(name)
    if value is None:
        return None
    allowed = RUN_FIELD_RULES[name]
    if allowed[1](value):
        return value
    problems.append(f"{RUN_FILE}: {name} must be {allowed[0]}, not {value!r:.40}")
    return None


def bounded_dict(value: Any) -> bool:
    try:
        return isinstance(value, dict) and json_size(value) <= MAX_RECORD_VALUES
    except ValueError:  # nested too deeply
        return False


def _workers_record(value: Any) -> bool:
    count = value.get("count") if isinstance(value, dict) else None
    return isinstance(count, int) and not isinstance(count, bool) and 1 <= count <= MAX_WORKERS


# What each field of run.json may hold, as errors say it, and the check.
RUN_FIELD_RULES: dict[str, tuple[str, Any]] = {
    **{name: ("a unix time (1970 to 9999)", is_sane_timestamp) for name in ("started", "finished", "pid_start_time")},
    "pid": (
        f"a process id from 1 to {MAX_PID}",
        lambda value: isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_PID,
    ),
    **{
        name: (
            f"text of at most {MAX_NAME_CHARS} characters",
            lambda value: isinstance(value, str) and len(value) <= MAX_NAME_CHARS,
        )
        for name in ("job", "name", "status", "source", "host", "pid_start")
    },
    "error": (
        f"text of at most {MAX_TEXT_CHARS} characters",
        lambda value: isinstance(value, str) and len(value) <= MAX_TEXT_CHARS,
    ),
    **{
        name: (f"a JSON object of at most {MAX_RECORD_VALUES} values", bounded_dict)
        for name in ("params", "summary", "final_metrics")
    },
    "workers": (f'{{"count": N}} with N from 1 to {MAX_WORKERS}', _workers_record),
}
