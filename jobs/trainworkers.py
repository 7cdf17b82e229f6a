"""The train job on many workers (MultiWorkerMirroredStrategy): which loop, who writes what, and a lost peer in words.

Every worker of a cluster runs the whole job: its own shard of the data
(``distribute_datasets_from_function``'s input context), the same steps, and
losses all-reduced over the cluster, so every worker reports the same epoch
figures. Only the chief writes TensorBoard scalars (TensorFlow's own rule:
other workers' summaries would be duplicates).

Why the custom loop and not Keras ``fit``: Keras 3's ``fit`` fails under
MultiWorkerMirroredStrategy ("Attempt to convert a value (PerReplica…)",
keras-team/keras#20585, open since TF 2.16). tf-keras with
``TF_USE_LEGACY_KERAS=1`` would train, but it is an extra dependency and a
second Keras in the process, with its own model and optimizer classes, for
one job; the custom loop already trains every other strategy here and
measured faster on loopback (8.5 s against tf-keras's 10.8 s for 3 epochs).

The runtime describes the cluster as a dict (``tpudash.accel.multiworker``'s
``cluster_description``); jobs read it duck-typed and import nothing of tpudash.
"""

from __future__ import annotations

import re
from typing import Any

from jobs.base import ParamError

FIT_UNDER_MWMS = (
    "loop=fit asked, but Keras 3's fit fails under MultiWorkerMirroredStrategy (keras-team/keras#20585): "
    "the custom loop trains instead, with the same reports"
)
PEER_LOSS_ERRORS = ("UnavailableError", "DeadlineExceededError", "AbortedError", "CancelledError")
PEER_LOSS_WORDS = ("collective ops is aborted", "stopped sending heartbeats", "is down", "coordination service")
# TensorFlow names a task /job:worker/replica:0/task:1 (or /job:worker/task:1).
TASK_NAME = re.compile(r"/job:(chief|worker)(?:/replica:\d+)?/task:(\d+)")
UNHEALTHY = re.compile(r"unhealthy[^:]*:\s*((?:/job:\w+(?:/replica:\d+)?/task:\d+[\s,]*)+)")
DOWN = re.compile(r"(/job:\w+(?:/replica:\d+)?/task:\d+) is down")
# A peer whose socket closed mid-collective: "… from remote target /job:worker/replica:0/task:0 while calling …".
REMOTE_TARGET = re.compile(r"remote target (/job:\w+(?:/replica:\d+)?/task:\d+)")
# TensorFlow's internal function and op names say nothing to a user.
INTERNAL_NAMES = re.compile(r"\{\{function_node [^}]*\}\}\s*|\s*\[Op:[^\]]*\](?: name:\s*\S*)?")
MESSAGE_CHARS = 600


class WorkerLost(RuntimeError):
    """A peer worker of the cluster is gone; the message names it when TensorFlow says which."""


def cluster_of(runtime: Any) -> dict | None:
    """The runtime's cluster description, or None when the process trains alone."""
    description = getattr(runtime, "description", None)
    cluster = getattr(description, "cluster", None)
    return cluster if isinstance(cluster, dict) and cluster.get("workers", 1) > 1 else None


def is_chief(runtime: Any) -> bool:
    cluster = cluster_of(runtime)
    return cluster is None or cluster.get("worker") == 0


def spans_workers(strategy: Any) -> bool:
    """Whether ``strategy`` is a MultiWorkerMirroredStrategy over a cluster (its inputs take no per-replica options)."""
    return bool(getattr(getattr(strategy, "extended", None), "_cluster_spec", None))


def cluster_replica_devices(local_devices: list[str], cluster: dict) -> list[str]:
    """Every replica's device over the cluster, in replica order: the chief's, then each worker's by task.

    ``local_devices``: this worker's replicas' devices (the strategy's
    ``worker_devices``). MultiWorkerMirroredStrategy gives every worker as
    many replicas and numbers them chief first, then ``/job:worker`` by task;
    each worker's devices are this worker's under its own job and task.
    """
    jobs = cluster.get("jobs") or {"worker": cluster.get("workers", 1)}
    tasks = [("chief", 0)] if jobs.get("chief") else []
    tasks += [("worker", index) for index in range(int(jobs.get("worker", 0)))]
    devices = []
    for job, index in tasks:
        task = f"/job:{job}/replica:0/task:{index}"
        devices += [
            TASK_NAME.sub(task, device) if TASK_NAME.search(device) else task + device for device in local_devices
        ]
    return devices


def training_loop(asked: str, cluster: dict | None) -> tuple[str, str | None]:
    """The loop that trains (fit or custom) for the ``loop`` param ``asked``, and a warning when it is not that one.

    ``auto`` (the default) is fit in one process and the custom loop on a
    cluster, without a word; only a ``fit`` the user asked for on a cluster
    is worth a warning.
    """
    if cluster is None:
        return ("fit" if asked == "auto" else asked), None
    return "custom", (FIT_UNDER_MWMS if asked == "fit" else None)


def check_workers(params: dict, runtime: Any) -> None:
    """``workers`` > 1 trains only inside a cluster of that size; the launcher starts it, never the job."""
    workers = params.get("workers", 1)
    cluster = cluster_of(runtime)
    if cluster is None:
        if workers > 1:
            raise ParamError(
                "workers",
                f"{workers} worker processes are started by the launcher (tpudash run train --workers {workers}, "
                f"or the form's workers field), each with its TF_CONFIG; this process has no cluster, "
                f"so it cannot train as {workers} workers; allowed here: 1",
            )
        return
    if workers > 1 and workers != cluster["workers"]:
        raise ParamError(
            "workers",
            f"{workers} disagrees with the cluster this worker is in ({cluster['workers']} workers in TF_CONFIG); "
            f"allowed: {cluster['workers']}",
        )


def is_peer_loss(error: BaseException) -> bool:
    """Whether ``error`` is a collective failing because a peer worker is gone (or stuck)."""
    text = str(error).lower()
    return type(error).__name__ in PEER_LOSS_ERRORS or any(word in text for word in PEER_LOSS_WORDS)


def lost_workers(text: str, cluster: dict) -> list[int]:
    """The worker numbers TensorFlow's message names as lost (unhealthy, down, or an address it could not reach)."""
    chief_jobs = 1 if (cluster.get("jobs") or {}).get("chief") else 0
    named: list[str] = []
    for match in UNHEALTHY.finditer(text):
        named.extend(task.group(0) for task in TASK_NAME.finditer(match.group(1)))
    named.extend(match.group(1) for match in DOWN.finditer(text))
    named.extend(match.group(1) for match in REMOTE_TARGET.finditer(text))
    found: list[int] = []
    for name in named:
        task = TASK_NAME.search(name)
        if task is None:
            continue
        job, index = task.group(1), int(task.group(2))
        worker = index if job == "chief" else index + chief_jobs
        if worker not in found and worker != cluster.get("worker"):
            found.append(worker)
    if not found:
        for position, address in enumerate(cluster.get("addresses") or []):
            if position != cluster.get("worker") and address and address in text:
                found.append(position)
    return found


def lost_worker_message(error: BaseException, cluster: dict) -> str:
    """``worker 1 (127.0.0.1:4242) was lost: <TensorFlow's words>``, or ``a peer worker was lost: …``."""
    text = str(error)
    addresses = cluster.get("addresses") or []
    lost = lost_workers(text, cluster)
    if lost:
        who = ", ".join(
            f"worker {worker} ({addresses[worker]})" if worker < len(addresses) else f"worker {worker}"
            for worker in lost
        )
        head = f"{who} {'was' if len(lost) == 1 else 'were'} lost"
    else:
        head = "a peer worker was lost"
    # TensorFlow's message repeats the graph's call stack; its first meaningful lines say what happened.
    lines = [
        line.strip()
        for line in text.splitlines()
        if line.strip() and not line.strip().startswith(("File ", "Detected at node", "[["))
    ]
    detail = INTERNAL_NAMES.sub(" ", " ".join(lines)).strip()[:MESSAGE_CHARS]
    return (
        f"{head} (this is worker {cluster.get('worker')} of {cluster.get('workers')}): {type(error).__name__}: {detail}"
    )
