"""A user's training script, started once per worker with its own TF_CONFIG: the cluster tests' stand-in.

``python -m tests.cluster.user_script RUNS_DIR record`` trains a loop through
``RecordedRun`` (no TensorFlow); ``… fit`` trains a tiny Keras model with
``TpudashCallback``. Either way the worker is found from TF_CONFIG and the run
id from TPUDASH_RUN_ID, as a user's script on a cluster finds them; worker 1
steps slower, so it is the run's straggler.
"""

from __future__ import annotations

import json
import os
import sys
import time

from tpudash.runs.workers import find_worker


def record_loop(runs_dir: str) -> None:
    from tpudash.recording import RecordedRun

    index = find_worker().index  # the chief is 0, TF_CONFIG's worker 0 is 1
    pause = 0.01 if index == 0 else 0.03  # worker 1 is slow: the straggler
    with RecordedRun("user-loop", {"steps": 40}, runs_dir=runs_dir) as run:
        for step in range(40):
            time.sleep(pause)  # the training step's work
            run.metric("loss", 1.0 / (step + 1) + index, step=step)
            run.progress(step + 1, 40, "step")


def keras_fit(runs_dir: str) -> None:
    import numpy as np

    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import keras

    from tpudash.callbacks import TpudashCallback

    index = find_worker().index  # the chief is 0, TF_CONFIG's worker 0 is 1
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 8)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("float32")
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss=keras.losses.BinaryCrossentropy(from_logits=True), metrics=["accuracy"])

    class SlowWorker(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            time.sleep(0.002 if index == 0 else 0.02)  # worker 1 is slow: the straggler

    model.fit(x, y, epochs=2, batch_size=16, verbose=0, callbacks=[SlowWorker(), TpudashCallback(runs_dir=runs_dir)])


def run_two_workers(runs_dir: str, mode: str, run_id: str, env: dict[str, str], timeout: float = 120.0) -> None:
    """Start the script as chief and as worker (TF_CONFIG on loopback ports nothing listens on) and wait for both."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cluster = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]}
    processes = []
    for task_type in ("chief", "worker"):
        config = {"cluster": cluster, "task": {"type": task_type, "index": 0}}
        child_env = dict(env, TF_CONFIG=json.dumps(config), TPUDASH_RUN_ID=run_id, PYTHONPATH=root)
        processes.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests.cluster.user_script", runs_dir, mode],
                cwd=root,
                env=child_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    for process in processes:
        output, _ = process.communicate(timeout=timeout)
        assert process.returncode == 0, output


if __name__ == "__main__":
    {"record": record_loop, "fit": keras_fit}[sys.argv[2]](sys.argv[1])
