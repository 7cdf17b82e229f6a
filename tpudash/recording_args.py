"""What a user hands ``tpudash.record`` and ``TpudashCallback``, checked: every mistake a RecordingError naming it.

Where the run goes (``runs_directory``), which worker of a cluster records
and the run id they share, the run's name and params, the numbers and steps
of ``metric`` and ``progress``, and per-replica values (a ``PerReplica``, a
sharded ``jax.Array``, a list or a mapping). Imports neither TensorFlow,
JAX nor Textual.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from jobs.events import to_jsonable
from tpudash.accel import jaxruntime
from tpudash.runs.layout import RUN_ID_RULE, is_run_id
from tpudash.runs.workers import WorkerIdentity, find_worker

RUN_ID_VARIABLE = "TPUDASH_RUN_ID"
"""The run every worker of a cluster records into, when the script does not say ``run_id=``."""


class RecordingError(ValueError):
    """A call the writer cannot record; the message names the argument and what is allowed."""


def runs_directory(runs_dir: str | os.PathLike | None = None) -> Path | str:
    """``runs_dir`` if given, else tpudash's own (``$TPUDASH_RUNS_DIR`` or ``$XDG_DATA_HOME/tpudash/runs``).

    A directory is a Path; a store (``gs://bucket/runs``) is its URL, and a
    store whose library is not installed is a RecordingError with the line
    that installs it.
    """
    from tpudash.config import ENV_PREFIX, default_runs_dir
    from tpudash.runs.location import ALLOWED, missing_library, parse_runs_dir

    # Not Settings.load: it checks every TPUDASH_* variable, and a malformed
    # one that has nothing to do with recording must not stop the user's training.
    configured = os.environ.get(f"{ENV_PREFIX}RUNS_DIR", "").strip()
    where = "runs_dir" if runs_dir is not None else f"{ENV_PREFIX}RUNS_DIR"
    text = os.fspath(runs_dir) if runs_dir is not None else configured
    if runs_dir is not None and not str(text).strip():
        raise RecordingError(f"runs_dir: is empty; allowed: {ALLOWED}, or None for tpudash's runs directory")
    if not text:
        return default_runs_dir(os.environ)
    try:
        location = parse_runs_dir(str(text))
    except ValueError as error:
        raise RecordingError(f"{where}: {error}") from None
    missing = missing_library(location) if isinstance(location, str) else None
    if missing is not None:
        raise RecordingError(f"{where}: {missing}")
    return location


def per_replica_parts(value: Any, devices: Iterable[str] | None = None) -> tuple[list, list[str]]:
    """(values, devices) of a ``PerReplica`` value, a sharded ``jax.Array`` or ``pmap`` output, a list, or a mapping.

    A jax array gives one value per addressable shard, named by its device
    (a one-element shard is a number). Values are read here, waiting for the
    device; ``RecordedRun.replica_values`` reads them on its own thread instead.
    """
    parts, names = replica_parts(value, devices)
    return [read_part(part) for part in parts], names


def replica_parts(value: Any, devices: Iterable[str] | None) -> tuple[list, list[str]]:
    """(parts, devices) of a per-replica value, jax arrays not read yet."""
    shards = jaxruntime.replica_shards(value)
    if shards is not None:
        parts, names = shards
    elif isinstance(value, Mapping):
        parts, names = list(value.values()), [str(key) for key in value]
    elif hasattr(value, "values") and isinstance(value.values, (tuple, list)):
        # tf.distribute's PerReplica (and Mirrored): one component per local replica.
        parts = list(value.values)
        names = [str(getattr(part, "device", "") or f"replica {index}") for index, part in enumerate(parts)]
    elif isinstance(value, (list, tuple)):
        parts, names = list(value), [f"replica {index}" for index in range(len(value))]
    else:
        raise RecordingError(
            f"value: {type(value).__name__} is not per-replica; allowed: a PerReplica value "
            "(what strategy.run returns), a sharded jax.Array or a pmap output, a list with one value per replica, "
            "or a {device: value} dict"
        )
    for part in [value, *parts]:
        problem = jaxruntime.traced_problem(part)
        if problem is not None:
            raise RecordingError(f"value: {problem}")
    if devices is not None:
        names = [str(device) for device in devices]
        if len(names) != len(parts):
            raise RecordingError(
                f"devices: {len(names)} given for {len(parts)} replica values; allowed: one per replica"
            )
    return parts, names


def read_part(part: Any) -> Any:
    """A value as JSON; a jax array's number waits for the device."""
    return jaxruntime.read_value(part) if jaxruntime.is_jax_array(part) else to_jsonable(part)


def run_id_word(name: str) -> str:
    """The part of the run id naming the run: ``My model/v2`` → ``my-model-v2``."""
    word = re.sub(r"[^a-z0-9._]+", "-", name.lower()).strip("-.")
    return word[:40] or "run"


def find_recording_worker(worker: int | WorkerIdentity | None, strategy: Any = None) -> WorkerIdentity | None:
    """``workers.find_worker``, its ValueError (a malformed TF_CONFIG, a bad ``worker``) as a RecordingError."""
    try:
        return find_worker(worker, strategy=strategy)
    except ValueError as error:
        raise RecordingError(str(error)) from None


def shared_run_id(run_id: str | None, worker: WorkerIdentity | None) -> str | None:
    """The run id every worker agrees on: ``run_id``, else ``$TPUDASH_RUN_ID``; None: make a new one.

    RecordingError when it is not a run id, or when several workers have none to share.
    """
    where = "run_id"
    if run_id is None and os.environ.get(RUN_ID_VARIABLE, "").strip():
        run_id, where = os.environ[RUN_ID_VARIABLE].strip(), RUN_ID_VARIABLE
    if run_id is not None:
        if not isinstance(run_id, str) or not is_run_id(run_id) or len(run_id) > 200:
            raise RecordingError(f"{where}: {run_id!r} is not allowed; allowed: {RUN_ID_RULE}, at most 200 characters")
        return run_id
    if worker is not None and worker.count > 1:
        raise RecordingError(
            f"run_id: this process is {worker.task} {worker.index} of {worker.count} workers, and they record one "
            f"run; allowed: the same run_id= on every worker (such as 'mnist-2024-06-01'), or {RUN_ID_VARIABLE} "
            "set for all of them"
        )
    return None


def checked_number(field: str, value: Any) -> float:
    plain = to_jsonable(value)
    if isinstance(plain, list) and len(plain) == 1:
        plain = plain[0]
    if isinstance(plain, bool) or not isinstance(plain, (int, float)):
        raise RecordingError(
            f"{field}: {value!r:.60} is not a number; allowed: a scalar (float, int, a 0-d tensor or NumPy value)"
        )
    return float(plain)


def checked_step(field: str, value: Any) -> int:
    number = checked_number(field, value)
    if not math.isfinite(number) or number != int(number) or number < 0:
        raise RecordingError(f"{field}: {value!r} is not allowed; allowed: a whole number ≥ 0")
    return int(number)


def check_run_name_and_params(name: Any, params: Any) -> None:
    """RecordingError unless ``name`` names a run (non-empty text) and ``params`` is a mapping or None."""
    if not isinstance(name, str) or not name.strip():
        raise RecordingError(f"name: {name!r} is not allowed; allowed: a non-empty text naming the run")
    if params is not None and not isinstance(params, Mapping):
        raise RecordingError(f"params: {type(params).__name__} is not allowed; allowed: a dict of name → value")
