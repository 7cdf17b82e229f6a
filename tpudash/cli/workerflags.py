"""``tpudash run``'s flags for many workers: ``--workers``, ``--worker-index``, ``--cluster``, ``--run-id``.

``--worker-index I --cluster A0,A1,…`` makes this process worker I of that
cluster by setting TF_CONFIG (before TensorFlow loads, which reads it once);
``--workers N`` is the job's ``workers`` param. What cannot be used is
BadInput naming the flag and what it may be.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from tpudash.cli.exits import BadInput

if TYPE_CHECKING:
    from jobs.base import JobSpec

MAX_RUN_ID_CHARS = 200


def join_cluster(args: argparse.Namespace) -> int | None:
    """``--worker-index I --cluster A0,A1,…``: this process is worker I, told to TensorFlow through TF_CONFIG.

    Returns the cluster's size, or None when neither flag is given (a TF_CONFIG the user exported is
    then used as it is). BadInput names the flag that cannot be used and what it may be.
    """
    from tpudash.engine.cluster import ClusterFlagError, cluster_addresses, die_with_launcher, tf_config, worker_index

    index_text, cluster_text = getattr(args, "worker_index", None), getattr(args, "cluster", None)
    if index_text is None and cluster_text is None:
        return None
    die_with_launcher(os.environ)  # a worker `tpudash run --workers N` started: never an orphan that trains on
    if index_text is None or cluster_text is None:
        raise BadInput(
            "--worker-index and --cluster go together: --worker-index I --cluster HOST:PORT,HOST:PORT,… "
            "makes this process worker I of that cluster"
        )
    try:
        addresses = cluster_addresses(cluster_text)
        index = worker_index(index_text, len(addresses))
    except ClusterFlagError as error:
        raise BadInput(str(error)) from None
    os.environ["TF_CONFIG"] = tf_config(addresses, index)
    return len(addresses)


def requested_workers(
    args: argparse.Namespace, spec: JobSpec, assignments: dict[str, str], cluster_size: int | None
) -> int:
    """How many workers the run has: ``--workers`` (the job's ``workers`` param, set in ``assignments``).

    In a cluster (``cluster_size``: from --cluster or TF_CONFIG) the param is the cluster's size.
    """
    from tpudash.engine.cluster import ClusterFlagError, worker_count

    takes_workers = any(param.name == "workers" for param in spec.params)
    count = None
    if getattr(args, "workers", None) is not None:
        try:
            count = worker_count(args.workers)
        except ClusterFlagError as error:
            raise BadInput(str(error)) from None
        if count > 1 and not takes_workers:
            raise BadInput(f"--workers: job {spec.name} runs in one process; only jobs with a workers param take it")
        if cluster_size is not None and count != cluster_size:
            raise BadInput(f"--workers {count}: this process is a worker of a cluster of {cluster_size}")
    elif cluster_size is not None:
        count = cluster_size
    if count is not None and takes_workers:
        given = assignments.get("workers")
        if given is not None and given.strip() != str(count):
            raise BadInput(
                f"--set workers={given} disagrees with the cluster's {count} workers (--workers or --cluster)"
            )
        assignments["workers"] = str(count)
    if not takes_workers:
        return 1
    try:
        return int(assignments.get("workers", "1"))
    except ValueError:
        return 1  # the param's own check names what is wrong with it


def checked_run_id(run_id: str | None) -> str | None:
    """``--run-id`` when it can name a run, or BadInput naming the flag and what it may be."""
    from tpudash.runs.layout import RESERVED_FOLDERS, is_reserved_name, is_run_id

    if run_id is None:
        return None
    if not is_run_id(run_id) or len(run_id) > MAX_RUN_ID_CHARS or not run_id.isprintable() or run_id.strip() != run_id:
        reserved = ", ".join(repr(name) for name in sorted(RESERVED_FOLDERS))
        why = (
            "is reserved: that folder of the runs directory holds the host agents' reports"
            if is_reserved_name(run_id)
            else "cannot name a run"
        )
        raise BadInput(
            f"--run-id: {run_id!r:.80} {why}; allowed: a plain name of up to {MAX_RUN_ID_CHARS} printable "
            f"characters (no '/', no leading '.', not {reserved}), the same on every worker, "
            "e.g. 20260101-120000-train-1a2b3c"
        )
    return run_id
