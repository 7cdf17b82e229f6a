"""``TpudashWriter``: CLU's ``MetricWriter`` interface writing a tpudash run, for JAX and Flax loops that log through CLU.

A loop that logs through CommonLoopUtils switches with one line::

    writer = TpudashWriter("my-loop")  # was: metric_writers.create_default_writer(logdir)
    writer.write_hparams({"learning_rate": 0.1})
    for step in range(steps):
        writer.write_scalars(step, {"train/loss": loss})
    writer.close()

It has every method of ``clu.metric_writers.MetricWriter`` (write_summaries,
write_scalars, write_images, write_videos, write_audios, write_texts,
write_histograms, write_pointcloud, write_hparams, flush, close) without
depending on CLU: it is duck-typed, so CLU's ``MultiWriter`` and
``AsyncWriter`` take it beside their own writers.

The run starts at the first write (``tpudash.record`` underneath), so
``write_hparams`` before any scalar gives the run its params; after, they
become a "hyperparameters" table and a log line. A scalar's name says its
split: ``train/loss`` → loss (train), ``eval/accuracy`` and ``val_loss`` →
val, ``test/acc`` → test; any other name is a train metric as it is. Values
may be JAX scalars (read off the training thread, as ``RecordedRun.metric``
reads them), NumPy values or numbers. Texts become log lines; images,
videos, audio, histograms, point clouds and raw summaries are accepted and
not shown, which one log line says the first time each arrives. ``close()``
finishes the run done; as a context manager an exception finishes it failed
(KeyboardInterrupt: cancelled), as ``record`` does. Imports neither JAX nor
TensorFlow.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

from tpudash.recording import RecordedRun, RecordingError, check_run_name_and_params

# How a CLU loop names a metric's split: a prefix folder (``train/loss``) or Keras's ``val_`` prefix.
SPLIT_FOLDERS = {
    "train": "train",
    "training": "train",
    "eval": "val",
    "evaluation": "val",
    "val": "val",
    "valid": "val",
    "validation": "val",
    "test": "test",
}
SPLIT_PREFIXES = {"val_": "val", "eval_": "val", "test_": "test"}


def metric_name_and_split(key: str) -> tuple[str, str]:
    """``train/loss`` → (loss, train); ``eval/accuracy`` and ``val_accuracy`` → (accuracy, val); ``lr`` → (lr, train)."""
    folder, slash, rest = key.partition("/")
    if slash and rest and folder.lower() in SPLIT_FOLDERS:
        return rest, SPLIT_FOLDERS[folder.lower()]
    for prefix, split in SPLIT_PREFIXES.items():
        if key.startswith(prefix) and len(key) > len(prefix):
            return key[len(prefix) :], split
    return key, "train"


class TpudashWriter:
    """CLU's MetricWriter writing a tpudash run; see the module docstring."""

    def __init__(
        self,
        name: str,
        params: Mapping[str, Any] | None = None,
        *,
        runs_dir: str | os.PathLike | None = None,
        worker: Any = None,
        run_id: str | None = None,
    ):
        """``name``, ``params``, ``runs_dir``, ``worker``, ``run_id``: as ``tpudash.record`` takes them."""
        check_run_name_and_params(name, params)  # said now, though the run starts at the first write
        self.name = name
        self.params = dict(params or {})
        self._options: dict[str, Any] = {"runs_dir": runs_dir, "worker": worker, "run_id": run_id}
        self.run: RecordedRun | None = None
        """The run written to: None until the first write."""
        self._not_shown: set[str] = set()
        self._last_step: int | None = None

    def _started(self) -> RecordedRun:
        if self.run is None:
            self.run = RecordedRun(self.name, self.params, **self._options)
        return self.run

    # -- what a loop writes ----------------------------------------------------------------
    def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
        """One metric per name at ``step``; the name's prefix gives its split (module docstring)."""
        run = self._started()
        for key, value in scalars.items():
            name, split = metric_name_and_split(str(key))
            run.metric(name, value, step=step, split=split)
        step_number = int(step)
        if split_of_any_train(scalars) and (self._last_step is None or step_number > self._last_step):
            # The live view's step count and the worker's time per step follow the train steps.
            self._last_step = step_number
            run.progress(step_number, None, "step")

    def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
        run = self._started()
        for key, text in texts.items():
            run.log(f"{key} (step {int(step)}): {text}")

    def write_hparams(self, hparams: Mapping[str, Any]) -> None:
        """Before the first write: the run's params; after: a "hyperparameters" table and a log line."""
        if not isinstance(hparams, Mapping):
            raise RecordingError(f"hparams: {type(hparams).__name__} is not allowed; allowed: a dict of name → value")
        if self.run is None:
            self.params.update(hparams)
            return
        self.run.table("hyperparameters", ["name", "value"], [[str(key), value] for key, value in hparams.items()])
        self.run.log(
            f"hyperparameters written after the run started (not in its params): {', '.join(map(str, hparams))}"
        )

    def write_summaries(self, step: int, values: Mapping[str, Any], metadata: Mapping[str, Any] | None = None) -> None:
        self._accept_unshown("summaries", "write_summaries", values)

    def write_images(self, step: int, images: Mapping[str, Any]) -> None:
        self._accept_unshown("images", "write_images", images)

    def write_videos(self, step: int, videos: Mapping[str, Any]) -> None:
        self._accept_unshown("videos", "write_videos", videos)

    def write_audios(self, step: int, audios: Mapping[str, Any], *, sample_rate: int) -> None:
        self._accept_unshown("audio", "write_audios", audios)

    def write_histograms(
        self, step: int, arrays: Mapping[str, Any], num_buckets: Mapping[str, int] | None = None
    ) -> None:
        self._accept_unshown("histograms", "write_histograms", arrays)

    def write_pointcloud(
        self,
        step: int,
        point_clouds: Mapping[str, Any],
        *,
        point_colors: Mapping[str, Any] | None = None,
        configs: Mapping[str, Any] | None = None,
    ) -> None:
        self._accept_unshown("point clouds", "write_pointcloud", point_clouds)

    def _accept_unshown(self, what: str, method: str, values: Mapping[str, Any]) -> None:
        """Taken and dropped (never read, so never a wait for the device); the first time, a log line says so."""
        run = self._started()
        if what in self._not_shown:
            return
        self._not_shown.add(what)
        names = ", ".join(map(str, values)) or "none"
        run.log(
            f"{method} ({names}): tpudash does not show {what}; they are not recorded "
            "(a TensorBoard writer beside this one in a MultiWriter keeps them)"
        )

    # -- ending ------------------------------------------------------------------------------
    def flush(self) -> None:
        """Put everything written so far on disk (JAX values waited for)."""
        if self.run is not None:
            self.run.flush()

    def close(self) -> None:
        """Finish the run done (later calls do nothing). Never written to and without params: no run is made."""
        if self.run is None and self.params:
            self._started()  # hyperparameters alone: a run that says what it was to train
        if self.run is not None:
            self.run.finish("done")

    def __enter__(self) -> TpudashWriter:
        return self

    def __exit__(self, exc_type, exception, trace) -> Literal[False]:
        if exception is None:
            self.close()
            return False
        self._started().__exit__(exc_type, exception, trace)
        return False

    def __repr__(self) -> str:
        return f"<TpudashWriter {self.name!r} {self.run!r}>"


def split_of_any_train(scalars: Mapping[str, Any]) -> bool:
    """Whether any of ``scalars`` is a train metric (its step then counts as a step of training)."""
    return any(metric_name_and_split(str(key))[1] == "train" for key in scalars)
