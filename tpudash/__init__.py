"""tpudash: a terminal cockpit for TensorFlow accelerator sessions.

This module re-exports the version (``tpudash.version``) and holds
``record``, the writer for the user's own training loops. Importing tpudash
must import neither tensorflow, jax nor textual, so the CLI and the TUI can
show something at once: ``record`` loads its module when it is called, and
``colab`` and ``TpudashWriter`` (CLU's MetricWriter, ``tpudash.metric_writer``)
when they are asked for.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

from tpudash.version import __version__

if TYPE_CHECKING:
    from tpudash.metric_writer import TpudashWriter
    from tpudash.recording import RecordedRun

__all__ = ["TpudashWriter", "__version__", "record"]


def record(
    name: str,
    params: Mapping[str, Any] | None = None,
    *,
    runs_dir: str | os.PathLike | None = None,
    strategy: Any = None,
    worker: Any = None,
    run_id: str | None = None,
) -> RecordedRun:
    """Record a custom training loop as a tpudash run the dashboard can watch live.

    ``with tpudash.record("name", params={...}) as run:`` then ``run.metric``,
    ``run.progress`` and ``run.replica_values``; see ``tpudash.recording``.
    ``strategy``: what the loop trains under, for the run's runtime: a
    ``tf.distribute.Strategy``, a Keras distribution (``DataParallel``,
    ``ModelParallel``) or a ``jax.sharding.Mesh``; None: TensorFlow's strategy in
    scope, or under JAX its devices and Keras's current distribution. JAX
    values recorded are read off the training thread (no wait for the device).
    ``worker`` (an index or a ``tpudash.runs.workers.WorkerIdentity``) and ``run_id``: the
    processes of one cluster record one run (found from TF_CONFIG or JAX when not given).
    """
    from tpudash.recording import RecordedRun

    return RecordedRun(name, params, runs_dir=runs_dir, strategy=strategy, worker=worker, run_id=run_id)


def __getattr__(name: str) -> ModuleType | type[TpudashWriter]:
    # ``from tpudash import colab`` is the notebook's entry point; it lives in
    # tpudash.web and loads only when asked for. So does CLU's writer.
    if name == "colab":
        from tpudash.web import colab

        return colab
    if name == "TpudashWriter":
        from tpudash.metric_writer import TpudashWriter

        return TpudashWriter
    raise AttributeError(f"module 'tpudash' has no attribute {name!r}")
