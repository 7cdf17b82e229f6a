"""A user's training script: ``model.fit`` with TpudashCallback under an 8-replica MirroredStrategy.

``python -m tests.fit_process`` trains a small classifier on a learnable
synthetic set into ``$TPUDASH_RUNS_DIR``, twice (runs "first-fit" and
"second-fit"). After each run's first epoch it prints ``epoch 1 of NAME``
(everything recorded so far is on disk by then) and waits for a line on
standard input before going on, so a test can look at the dashboard while
the run is live, then let it finish or kill the process. The unit tests of
the callback train the same model on the same data in their own process.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

REPLICAS = 8
EPOCHS = 3
GLOBAL_BATCH = 64
TRAIN_EXAMPLES = 768
VAL_EXAMPLES = 256


def separable_data(strategy, train_examples: int = TRAIN_EXAMPLES, seed: int = 0):
    """(train, val, steps per epoch, validation steps): a linearly separable 2-class set, so a model learns it.

    Each replica reads its own host pipeline, as tpudash's train job does on
    the CPU: a dataset handed to ``fit`` as it is goes through TensorFlow's
    multi-device iterator, whose tuning threads hold every validation and
    every ``fit``'s end for seconds to minutes on CPU replicas.
    """
    import tensorflow as tf

    generator = np.random.default_rng(seed)
    features = generator.normal(size=(train_examples + VAL_EXAMPLES, 8)).astype("float32")
    labels = (features[:, 0] + features[:, 1] > 0).astype("int32")
    splits = {
        "train": (features[:train_examples], labels[:train_examples]),
        "val": (features[train_examples:], labels[train_examples:]),
    }
    options = tf.distribute.InputOptions(
        experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA, experimental_fetch_to_device=False
    )
    no_tuning = tf.data.Options()
    no_tuning.autotune.enabled = False

    def pipeline(split):
        def make(context):
            dataset = tf.data.Dataset.from_tensor_slices(splits[split])
            dataset = dataset.shard(context.num_input_pipelines, context.input_pipeline_id)
            dataset = dataset.batch(context.get_per_replica_batch_size(GLOBAL_BATCH), drop_remainder=True)
            return dataset.repeat().with_options(no_tuning)

        return strategy.distribute_datasets_from_function(make, options=options)

    return pipeline("train"), pipeline("val"), train_examples // GLOBAL_BATCH, VAL_EXAMPLES // GLOBAL_BATCH


def separable_model(strategy):
    import keras

    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)], name="separable"
        )
        model.compile(
            keras.optimizers.Adam(0.02),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    return model


def main() -> None:
    import tensorflow as tf

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
    train, val, steps, validation_steps = separable_data(strategy)
    model = separable_model(strategy)
    for name in ("first-fit", "second-fit"):
        recorder = TpudashCallback(name=name, every_n_batches=1, batch_size=GLOBAL_BATCH)
        model.fit(
            train,
            epochs=EPOCHS,
            steps_per_epoch=steps,
            validation_data=val,
            validation_steps=validation_steps,
            verbose=0,
            callbacks=[recorder, WaitAfterFirstEpoch(recorder)],
        )
        print(f"done {name}", flush=True)


if __name__ == "__main__":
    main()
