"""A user's training that keeps its run in a bucket and trains until told to stop: for profiling it from elsewhere.

``python -m tests.functional.bucket_profile_fit URL`` trains a tiny classifier
with ``model.fit`` and ``TpudashCallback(runs_dir=URL)`` (gs://…; the store's
client settings come from the environment), epoch after epoch. Once its run
is in the store it prints ``live RUN_ID``; it stops at the next batch after a
line (or the end) on standard input, and prints ``done RUN_ID``. A profile
asked for over the bus (``tpudash profile RUN``) is answered by its callback.
"""

from __future__ import annotations

import os
import sys
import threading

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

BATCH = 32
MAX_EPOCHS = 100_000  # the stop on stdin ends it: this only bounds a test that forgot


def main() -> None:
    import keras
    import tensorflow as tf

    from tests.fit_process import separable_model
    from tests.functional.bucket_fit import separable_set
    from tpudash.callbacks import TpudashCallback

    url = sys.argv[1]
    features, labels = separable_set()
    model = separable_model(tf.distribute.get_strategy())  # the default strategy: one device, no scope needed
    recorder = TpudashCallback(name="bucket-profile", runs_dir=url)
    told_to_stop = threading.Event()

    def wait_for_stop() -> None:
        sys.stdin.readline()
        told_to_stop.set()

    threading.Thread(target=wait_for_stop, daemon=True).start()

    class SayLiveThenStopWhenTold(keras.callbacks.Callback):
        said = False

        def on_train_batch_end(self, batch, logs=None):
            if not self.said:
                self.said = True
                recorder.run.flush()  # the run is in the store before anyone is told to look
                print(f"live {recorder.run.run_id}", flush=True)
            if told_to_stop.is_set():
                self.model.stop_training = True

    model.fit(
        features,
        labels,
        batch_size=BATCH,
        epochs=MAX_EPOCHS,
        verbose=0,
        callbacks=[recorder, SayLiveThenStopWhenTold()],
    )
    print(f"done {recorder.run.run_id}", flush=True)


if __name__ == "__main__":
    main()
