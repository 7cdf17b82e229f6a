"""A user's training script that keeps its run in a bucket: ``model.fit`` with ``TpudashCallback(runs_dir=URL)``.

``python -m tests.functional.bucket_fit URL`` trains a tiny classifier on a
learnable synthetic set for three epochs on the CPU, its run written into the
store at ``URL`` (gs://…, s3://…; the store's client settings come from the
environment). After the first epoch it prints ``epoch 1 of RUN_ID`` and
waits for a line on standard input before going on, so a test can watch the
run while it is live; at the end it prints ``done RUN_ID``.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

EPOCHS = 3
EXAMPLES = 256
BATCH = 32


def separable_set() -> tuple[np.ndarray, np.ndarray]:
    """``EXAMPLES`` examples of 8 features, labelled by the sign of the first two's sum: learnable."""
    generator = np.random.default_rng(0)
    features = generator.normal(size=(EXAMPLES, 8)).astype("float32")
    return features, (features[:, 0] + features[:, 1] > 0).astype("int32")


def main() -> None:
    import keras
    import tensorflow as tf

    from tests.fit_process import separable_model
    from tpudash.callbacks import TpudashCallback

    url = sys.argv[1]
    features, labels = separable_set()
    model = separable_model(tf.distribute.get_strategy())  # the default strategy: one device, no scope needed
    recorder = TpudashCallback(name="bucket-fit", runs_dir=url, every_n_batches=1)

    class HoldAfterFirstEpoch(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 0:
                recorder.run.flush()
                print(f"epoch 1 of {recorder.run.run_id}", flush=True)
                sys.stdin.readline()

    model.fit(
        features,
        labels,
        batch_size=BATCH,
        epochs=EPOCHS,
        validation_split=0.25,
        verbose=0,
        callbacks=[recorder, HoldAfterFirstEpoch()],
    )
    print(f"done {recorder.run.run_id}", flush=True)


if __name__ == "__main__":
    main()
