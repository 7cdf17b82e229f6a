"""One run written by many workers: who a worker is, its step times, its heartbeat, and reading them back.

A training cluster (``MultiWorkerMirroredStrategy`` with ``TF_CONFIG``, a JAX
job on every host of a pod) runs the user's script once per worker. Each of
them records into the same run: the chief (index 0) writes run.json and the
run's ``events`` stream, every other worker its own stream ``worker-<index>``
(``RunStore.join``), and every one of them a heartbeat
``writers/<writer>.json`` every ``liveness.HEARTBEAT_INTERVAL_SECONDS`` with
its progress and its time per step (``StepTimer``).

``find_worker`` tells a process which worker it is, without importing
TensorFlow or JAX. ``read_workers`` reads the heartbeats back (they come from
other hosts: each is size-capped and checked field by field, a bad one is
skipped and named; they are read newest first, so junk never hides a worker
that beats) and ``mark_stragglers`` marks a worker whose step time is
more than ``STRAGGLER_MARGIN`` over the median of the workers' step times.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import sys
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from jobs.events import Event, Metric, Progress, is_finite_number
from tpudash.runs import heartbeat
from tpudash.runs.backends import RunFiles
from tpudash.runs.liveness import (
    HEARTBEAT_INTERVAL_SECONDS,
    MAX_HEARTBEAT_BYTES,
    MAX_WRITERS_READ,
    WRITERS_FOLDER,
    beat_state,
)

STRAGGLER_MARGIN = 0.25
"""A worker whose step time is more than this fraction over the median of its cluster's is a straggler."""
# Per-step times the median is taken over: recent enough to follow a slowdown within a few dozen steps.
STEP_WINDOW = 32
# The most workers one run lists (a 64-host pod has 64): more heartbeats than this are not read.
MAX_WORKERS = MAX_WRITERS_READ
# What a heartbeat's texts may hold (a host name, a writer id, a task type).
MAX_WORKER_TEXT = 256
# Heartbeats that break a rule are named one by one up to this many; the rest are counted in one line.
MAX_PROBLEMS_NAMED = 5
WORKER_TASKS = ("chief", "worker")
"""TF_CONFIG's task types that train; their workers are numbered chief first."""


def worker_stream(index: int) -> str:
    """The stream a non-chief worker's events go to: ``worker-1`` (``worker-1/<writer>-<seq>.jsonl``)."""
    return f"worker-{index}"


def is_worker_stream(name: str) -> bool:
    prefix, _, number = name.partition("-")
    return prefix == "worker" and number.isdigit()


@dataclass(frozen=True)
class WorkerIdentity:
    """Which worker of a training cluster this process is."""

    index: int
    """0..count-1; the chief is 0."""
    count: int
    """Workers in the cluster."""
    task: str
    """``chief`` / ``worker`` as TF_CONFIG names it, ``process`` (JAX), ``worker`` (given explicitly)."""
    host: str
    """This worker's address (TF_CONFIG's ``host:port``) or hostname."""

    @property
    def is_chief(self) -> bool:
        return self.index == 0


def find_worker(
    worker: int | WorkerIdentity | None = None,
    *,
    strategy: Any = None,
    environ: Mapping[str, str] = os.environ,
) -> WorkerIdentity | None:
    """This process's worker, or None when it trains alone.

    In order: ``worker`` as given (a number: that index, the count from
    TF_CONFIG or JAX when they know it, else index + 1); ``TF_CONFIG``'s task
    (when its cluster has more than one task; a ``chief`` is worker 0 and
    ``worker`` i then is i + 1); ``strategy.cluster_resolver`` (a
    MultiWorkerMirroredStrategy's; a TPU pod's resolver is one client and
    counts as one process); ``jax.process_index()`` when JAX is already
    loaded. A malformed TF_CONFIG raises ValueError naming the field.
    """
    if isinstance(worker, WorkerIdentity):
        return worker
    if worker is not None:
        if isinstance(worker, bool) or not isinstance(worker, int) or worker < 0:
            raise ValueError(f"worker: {worker!r} is not allowed; allowed: a whole number ≥ 0, or a WorkerIdentity")
        found = _from_tf_config(environ) or _from_resolver(strategy) or _from_jax()
        count = found.count if found is not None and found.count > worker else worker + 1
        return WorkerIdentity(index=worker, count=count, task="worker", host=socket.gethostname())
    return _from_tf_config(environ) or _from_resolver(strategy) or _from_jax()


def _from_tf_config(environ: Mapping[str, str]) -> WorkerIdentity | None:
    found = read_tf_config(environ)
    return worker_in_cluster(*found, "TF_CONFIG") if found is not None else None


def read_tf_config(environ: Mapping[str, str]) -> tuple[dict[str, list[str]], Any] | None:
    """``TF_CONFIG``'s cluster and task, its shape checked (None when it is not set).

    The one reader of TF_CONFIG: the runtime (``tpudash.accel.multiworker``) adds the
    strategy's own rules to it. A malformed one raises ValueError naming the field.
    """
    text = (environ.get("TF_CONFIG") or "").strip()
    if not text:
        return None
    try:
        config = json.loads(text)
    except ValueError as error:
        raise ValueError(f"TF_CONFIG: not JSON ({error})") from None
    if not isinstance(config, dict):
        raise ValueError('TF_CONFIG: must be a JSON object such as {"cluster": {...}, "task": {...}}')
    cluster = config.get("cluster") or {}
    if not isinstance(cluster, dict) or not all(
        isinstance(tasks, list) and tasks and all(isinstance(address, str) and address for address in tasks)
        for tasks in cluster.values()
    ):
        raise ValueError('TF_CONFIG.cluster: must map each task type to a list of "host:port" addresses')
    return cluster, config.get("task")


def worker_in_cluster(cluster: Mapping[str, list], task: Any, where: str) -> WorkerIdentity | None:
    """The worker a task is in a cluster (TF_CONFIG's shape), or None when the cluster has one task only."""
    if sum(len(tasks) for tasks in cluster.values()) <= 1:
        return None
    if not isinstance(task, dict):
        raise ValueError(f'{where}.task: must be an object such as {{"type": "worker", "index": 0}}')
    task_type, index = task.get("type"), task.get("index", 0)
    if not isinstance(task_type, str) or task_type not in cluster:
        raise ValueError(f"{where}.task.type: {task_type!r} is not allowed; allowed: {', '.join(sorted(cluster))}")
    tasks = cluster[task_type]
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(tasks):
        raise ValueError(f"{where}.task.index: {index!r} is not allowed; allowed: 0 to {len(tasks) - 1}")
    if task_type not in WORKER_TASKS:
        return None  # a parameter server or an evaluator: not one of the workers that train the run
    chiefs = len(cluster.get("chief") or [])
    count = chiefs + len(cluster.get("worker") or [])
    number = index if task_type == "chief" else chiefs + index
    return WorkerIdentity(index=number, count=count, task=task_type, host=str(tasks[index])[:MAX_WORKER_TEXT])


def _from_resolver(strategy: Any) -> WorkerIdentity | None:
    resolver = getattr(strategy, "cluster_resolver", None) if strategy is not None else None
    if resolver is None or type(resolver).__name__.startswith("TPU"):
        return None  # TF on a TPU pod is one client driving every host
    try:
        spec = resolver.cluster_spec()
        cluster = spec.as_dict() if hasattr(spec, "as_dict") else dict(spec)
        cluster = {
            job: list(tasks.values()) if isinstance(tasks, dict) else list(tasks) for job, tasks in cluster.items()
        }
        task = {"type": resolver.task_type, "index": int(resolver.task_id or 0)}
    except Exception:  # noqa: BLE001 - a resolver that cannot say: this process is counted as alone
        return None
    return worker_in_cluster(cluster, task, "strategy.cluster_resolver")


def _from_jax() -> WorkerIdentity | None:
    jax = sys.modules.get("jax")
    if jax is None:
        return None  # never imported here: loading JAX would take the accelerator
    try:
        index, count = int(jax.process_index()), int(jax.process_count())
    except Exception:  # noqa: BLE001 - a JAX without a backend: one process
        return None
    if count <= 1:
        return None
    return WorkerIdentity(index=index, count=count, task="process", host=socket.gethostname())


class StepTimer:
    """A worker's time per step: the median of its recent per-step times, fed the events it records.

    Steps come from ``Progress`` (unit ``step``) and ``Metric(step=…)``, each
    followed on its own (a callback's progress counts steps within an epoch, its
    metrics steps of the whole fit). A step count that goes back (a new epoch)
    starts over without a sample.
    """

    def __init__(self, window: int = STEP_WINDOW) -> None:
        self._times: deque[float] = deque(maxlen=window)
        self._last: dict[str, tuple[int, float]] = {}
        self.progress: dict[str, Any] | None = None
        """The latest progress: ``{"done", "total", "unit"}`` (steps before any other unit)."""

    def observe(self, event: Event, timestamp: float) -> None:
        if isinstance(event, Progress):
            if event.unit == "step" or self.progress is None or self.progress.get("unit") != "step":
                self.progress = {"done": event.done, "total": event.total, "unit": event.unit}
            if event.unit == "step":
                self._advance("progress", event.done, timestamp)
        elif isinstance(event, Metric) and isinstance(event.step, int):
            self._advance("metric", event.step, timestamp)

    @property
    def step(self) -> int | None:
        """The latest step: of the metrics when there are any (steps of the whole run), else of the progress."""
        last = self._last.get("metric") or self._last.get("progress")
        return last[0] if last is not None else None

    def _advance(self, kind: str, step: int, timestamp: float) -> None:
        last = self._last.get(kind)
        if last is not None and step == last[0]:
            return  # another metric of the same step
        if last is not None and step > last[0] and timestamp > last[1]:
            self._times.append((timestamp - last[1]) / (step - last[0]))
        self._last[kind] = (step, timestamp)

    @property
    def step_seconds(self) -> float | None:
        return statistics.median(self._times) if self._times else None


def heartbeat_payload(
    writer: str, worker: WorkerIdentity | None, timer: StepTimer | None, *, status: str | None = None
) -> dict[str, Any]:
    """What a writer's heartbeat says: when, who, and for a worker its step stats (see ``read_workers``)."""
    payload: dict[str, Any] = {
        "heartbeat": round(time.time(), 3),
        "interval": HEARTBEAT_INTERVAL_SECONDS,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "writer": writer,
    }
    if worker is not None:
        step_seconds = timer.step_seconds if timer is not None else None
        payload.update(
            worker=worker.index,
            workers=worker.count,
            task=worker.task,
            host=worker.host,
            step=timer.step if timer is not None else None,
            step_seconds=round(step_seconds, 6) if step_seconds is not None else None,
            progress=dict(timer.progress) if timer is not None and timer.progress else None,
        )
        if status is not None:
            payload["status"] = status
    return payload


@dataclass(frozen=True)
class WorkerStatus:
    """One worker of a run as its heartbeat tells it."""

    index: int
    task: str
    host: str
    writer: str
    heartbeat: float
    age: float
    """Seconds since its heartbeat (negative: a clock ahead of ours)."""
    alive: bool
    """Still writing: its heartbeat is live by the one rule (``heartbeat.judge``) and it has not said it ended."""
    step: int | None = None
    step_seconds: float | None = None
    progress: tuple[int, int | None, str] | None = None
    """(done, total, unit) of its latest progress."""
    count: int | None = None
    """How many workers it says the cluster has."""
    status: str | None = None
    """``running``, or how it ended (``done``, ``failed``…), when it said."""
    straggler: bool = False

    @property
    def ended(self) -> bool:
        """It said how it ended (``done``, ``failed``, ``cancelled``) in its last heartbeat."""
        return self.status not in (None, "running")

    @property
    def counted(self) -> bool:
        """Whether its step time counts for the median: live, or ended (a stale one's is old news)."""
        return self.alive or self.ended


def _text(payload: dict, name: str) -> str:
    value = payload.get(name)
    if not isinstance(value, str) or not value or len(value) > MAX_WORKER_TEXT:
        raise ValueError(f"{name} must be text of 1 to {MAX_WORKER_TEXT} characters")
    return value


def _whole(value: Any, name: str, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value < 2**53:
        raise ValueError(f"{name} must be a whole number ≥ {low}")
    return value


def parse_worker_heartbeat(data: bytes, now: float) -> WorkerStatus | None:
    """A worker's heartbeat checked field by field; None for a writer that is no worker; ValueError names a bad field."""
    if len(data) > MAX_HEARTBEAT_BYTES:
        raise ValueError(f"larger than {MAX_HEARTBEAT_BYTES} bytes")
    try:
        payload = json.loads(data)
    except ValueError:
        raise ValueError("not JSON") from None
    if not isinstance(payload, dict):
        raise ValueError("not a JSON object")
    if payload.get("worker") is None:
        return None  # a run's only writer (no cluster): not listed as a worker
    beat = payload.get("heartbeat")
    if not is_finite_number(beat):
        raise ValueError("heartbeat must be a unix time")
    index = _whole(payload.get("worker"), "worker")
    if index >= MAX_WORKERS:
        raise ValueError(f"worker must be below {MAX_WORKERS}")
    count = payload.get("workers")
    count = None if count is None else _whole(count, "workers", 1)
    step = payload.get("step")
    step = None if step is None else _whole(step, "step")
    step_seconds = payload.get("step_seconds")
    if step_seconds is not None and not (is_finite_number(step_seconds) and 0 <= step_seconds <= 1e6):
        raise ValueError("step_seconds must be a number of seconds ≥ 0")
    status = payload.get("status")
    if status is not None and (not isinstance(status, str) or len(status) > 32):
        raise ValueError("status must be a short text")
    return WorkerStatus(
        index=index,
        task=_text(payload, "task"),
        host=_text(payload, "host"),
        writer=_text(payload, "writer"),
        heartbeat=float(beat),
        age=now - float(beat),
        alive=beat_state(data, now) == heartbeat.LIVE and status in (None, "running"),
        step=step,
        step_seconds=None if step_seconds is None else float(step_seconds),
        progress=_progress(payload.get("progress")),
        count=count,
        status=status,
    )


def _progress(value: Any) -> tuple[int, int | None, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError('progress must be {"done", "total", "unit"} or null')
    total = value.get("total")
    unit = value.get("unit")
    if not isinstance(unit, str) or not unit or len(unit) > 32:
        raise ValueError("progress.unit must be a short text")
    return _whole(value.get("done"), "progress.done"), None if total is None else _whole(total, "progress.total"), unit


def read_workers(files: RunFiles, now: float | None = None, problems: list[str] | None = None) -> list[WorkerStatus]:
    """A run's workers from their heartbeats (``writers/*.json``), by index, stragglers marked.

    The newest ``MAX_WORKERS`` heartbeats are read (files that are no
    heartbeat never hide one that beats). A worker restarted under a new
    writer id keeps its newest heartbeat. A heartbeat that breaks a rule is
    skipped and named in ``problems`` (the first ``MAX_PROBLEMS_NAMED`` one by
    one, the rest counted), and one from the future is named as such: its
    worker is not live. Raises what the store raises when it cannot list the run.
    """
    newest: dict[int, WorkerStatus] = {}
    skipped = 0
    names = heartbeat.listed_newest_first(files, WRITERS_FOLDER)
    for name in names[:MAX_WORKERS]:
        if not name.endswith(".json"):
            continue
        try:
            data = files.read(f"{WRITERS_FOLDER}/{name}", MAX_HEARTBEAT_BYTES)
            # Judged when read: a slow store's later files are not taken for ones from the future.
            at = time.time() if now is None else now
            status = parse_worker_heartbeat(data, at)
        except FileNotFoundError:
            continue  # removed since the listing
        except (OSError, ValueError) as error:
            skipped += 1
            if problems is not None and skipped <= MAX_PROBLEMS_NAMED:
                problems.append(f"{WRITERS_FOLDER}/{name}: {error}")
            continue
        if status is None:
            continue
        if status.age < -heartbeat.CLOCK_SKEW_SECONDS:
            heartbeat.add_problem(
                problems,
                f"{WRITERS_FOLDER}/{name}: worker {status.index}: {heartbeat.ahead_words(status.heartbeat, at)}",
            )
        kept = newest.get(status.index)
        if kept is None or _recency(status) > _recency(kept):
            newest[status.index] = status
    if problems is not None and skipped > MAX_PROBLEMS_NAMED:
        problems.append(f"{WRITERS_FOLDER}/: {skipped - MAX_PROBLEMS_NAMED:,} more files are no heartbeats; skipped")
    if problems is not None and len(names) > MAX_WORKERS:
        problems.append(f"{WRITERS_FOLDER}/: {len(names):,} files; the newest {MAX_WORKERS} were read")
    return mark_stragglers([newest[index] for index in sorted(newest)])


def end_unended_workers(files: RunFiles, status: str) -> list[int]:
    """Say ``status`` in the last heartbeat of every worker of a run that ended without saying how it ended.

    For the launcher, once every worker process is gone: a worker stopped by a cancel while it waited in a
    collective on a chief that had already left is killed at the end of the grace, before its last beat.
    Its heartbeat keeps its time (the table shows how long ago it last beat). Returns the workers' indexes.
    """
    ended = []
    for status_now in read_workers(files):
        if status_now.ended:
            continue
        name = f"{WRITERS_FOLDER}/{status_now.writer}.json"
        payload = json.loads(files.read(name, MAX_HEARTBEAT_BYTES))
        payload["status"] = status
        files.write(name, json.dumps(payload, sort_keys=True).encode())
        ended.append(status_now.index)
    return ended


def _recency(status: WorkerStatus) -> tuple[bool, float]:
    """Which of one worker's heartbeats is its latest: one from the future never outranks one from the past."""
    return status.age >= -heartbeat.CLOCK_SKEW_SECONDS, status.heartbeat


def mark_stragglers(statuses: list[WorkerStatus], margin: float = STRAGGLER_MARGIN) -> list[WorkerStatus]:
    """The workers, a straggler marked: its step time more than ``margin`` over the median.

    The median is of the workers that report a step time and are live or ended (``WorkerStatus.counted``:
    not stale); with fewer than two no one is marked.
    """
    times = [status.step_seconds for status in statuses if status.counted and status.step_seconds is not None]
    if len(times) < 2:
        return [replace(status, straggler=False) for status in statuses]
    median = statistics.median(times)
    return [
        replace(
            status,
            straggler=status.counted
            and status.step_seconds is not None
            and status.step_seconds > median * (1 + margin),
        )
        for status in statuses
    ]
