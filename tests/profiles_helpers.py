"""Real captures with known bottlenecks, made by TensorFlow's profiler in a process of their own.

``python -m tests.profiles_helpers OUT_DIR [--steps N] [--only KIND ...]`` writes one logdir
per kind under OUT_DIR (``OUT_DIR/<kind>/plugins/profile/<capture>/<host>.xplane.pb``):

- ``input``: a Keras fit whose tf.data map calls a ``py_function`` that sleeps 40 ms per batch;
- ``compute``: cached, prefetched data through wide Dense layers;
- ``nomarker``: the input-bound fit profiled without step markers.

Steps are marked as tpudash's writers mark them: Keras's ``train_function`` wrapped in
``tf.profiler.experimental.Trace("train", step_num=n, _r=1)``. One process makes them all
(TensorFlow is imported once), so a test module pays for one import.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

KINDS = ("input", "compute", "nomarker")
WARMUP_STEPS = 3
INPUT_SLEEP_SECONDS = 0.04


def capture_dirs(logdir: Path) -> list[Path]:
    """The capture folders a profiler wrote under ``logdir``."""
    return sorted(path for path in (logdir / "plugins" / "profile").glob("*") if path.is_dir())


def make_captures(out_dir: Path, *, steps: int = 5, kinds: tuple[str, ...] = KINDS, timeout: float = 240.0) -> None:
    """Run this module in a child (TensorFlow stays out of the test process) and wait for its captures."""
    subprocess.run(
        [sys.executable, "-m", "tests.profiles_helpers", str(out_dir), "--steps", str(steps), "--only", *kinds],
        check=True,
        timeout=timeout,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _fit(logdir: Path, kind: str, steps: int) -> None:
    import keras
    import numpy as np
    import tensorflow as tf

    if kind == "compute":
        features, width, batch = 512, 2048, 256
    else:
        features, width, batch = 64, 64, 64
    x = np.random.rand(batch * 8, features).astype("float32")
    y = np.random.randint(0, 10, batch * 8)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)
    if kind == "compute":
        data = data.cache().repeat().prefetch(tf.data.AUTOTUNE)
    else:

        def slow(a: object, b: object) -> tuple[object, object]:
            time.sleep(INPUT_SLEEP_SECONDS)
            return a, b

        data = (
            data.map(lambda a, b: tf.py_function(slow, [a, b], [tf.float32, tf.int64]))
            .map(lambda a, b: (tf.ensure_shape(a, [None, features]), tf.ensure_shape(b, [None])))
            .repeat()
        )
    layers = [keras.Input((features,)), keras.layers.Dense(width, activation="relu")]
    if kind == "compute":
        layers.append(keras.layers.Dense(width, activation="relu"))
    model = keras.Sequential([*layers, keras.layers.Dense(10)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    marked = kind != "nomarker"

    class Profile(keras.callbacks.Callback):
        def on_train_begin(self, logs: object = None) -> None:
            if not marked:
                return
            step_function = self.model.make_train_function()
            count = [0]

            def with_marker(iterator: object) -> object:
                count[0] += 1
                with tf.profiler.experimental.Trace("train", step_num=count[0], _r=1):
                    return step_function(iterator)

            self.model.train_function = with_marker

        def on_train_batch_begin(self, batch: int, logs: object = None) -> None:
            if batch == WARMUP_STEPS:
                tf.profiler.experimental.start(str(logdir))

        def on_train_batch_end(self, batch: int, logs: object = None) -> None:
            if batch == WARMUP_STEPS + steps - 1:
                tf.profiler.experimental.stop()

    model.fit(data, steps_per_epoch=WARMUP_STEPS + steps + 1, epochs=1, callbacks=[Profile()], verbose=0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--only", nargs="*", choices=KINDS, default=list(KINDS))
    arguments = parser.parse_args()
    for kind in arguments.only:
        _fit(arguments.out_dir / kind, kind, arguments.steps)


if __name__ == "__main__":
    main()
