"""A user's training script: ``model.fit`` with TpudashCallback under an 8-replica MirroredStrategy.

``python -m tests.fit_process`` trains a small classifier on a learnable
synthetic set into ``$TPUDASH_RUNS_DIR``, twice (two runs, "first-fit" and
"second-fit"). After each run's first epoch it prints ``epoch 1 of NAME``
(everything recorded so far is on disk by then) and waits for a line on
standard input before going on, so a test can look at the dashboard while
the run is live, then let it finish or kill the process.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

REPLICAS = 8
EPOCHS = 3


def main() -> None:
    processor = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(processor, [tf.config.LogicalDeviceConfiguration()] * REPLICAS)
    import keras

    from tpudash.callbacks import TpudashCallback

    class WaitAfterFirstEpoch(keras.callbacks.Callback):
        def __init__(self, recorder: TpudashCallback):
            super().__init__()
            self.recorder = recorder

        def on_epoch_end(self, epoch, logs=None):
            if epoch == 0:
                self.recorder.run.flush()
                print(f"epoch 1 of {self.recorder.run.name}", flush=True)
                sys.stdin.readline()

    strategy = tf.distribute.MirroredStrategy([device.name for device in tf.config.list_logical_devices("CPU")])
    generator = np.random.default_rng(0)
    features = generator.normal(size=(2048, 8)).astype("float32")
    labels = (features[:, 0] + features[:, 1] > 0).astype("int32")  # linearly separable: learnable
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(2)], name="separable")
        model.compile(keras.optimizers.Adam(0.01),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    for name in ("first-fit", "second-fit"):
        recorder = TpudashCallback(name=name, every_n_batches=1)
        model.fit(features, labels, batch_size=128, epochs=EPOCHS, validation_split=0.25, verbose=0,
                  callbacks=[recorder, WaitAfterFirstEpoch(recorder)])
        print(f"done {name}", flush=True)


if __name__ == "__main__":
    main()
