"""TensorBoard scalars written without TensorFlow (``jobs.tfevents``, the train job on JAX): TensorFlow reads them back."""

from __future__ import annotations

import pytest

from jobs.tfevents import EventFileScalars, crc32c


def test_crc32c_is_castagnolis():
    # The check value of CRC-32C (RFC 3720's test vector).
    assert crc32c(b"123456789") == 0xE3069283


def test_tensorflow_reads_the_scalars_back_per_split(tmp_path):
    tf = pytest.importorskip("tensorflow")
    scalars = EventFileScalars(tmp_path)
    for step, (loss, accuracy) in enumerate([(2.5, 0.25), (1.25, 0.5)], start=1):
        scalars.write("train", "epoch_loss", loss, step)
        scalars.write("val", "epoch_accuracy", accuracy, step)
    scalars.close()
    read: dict[str, list] = {}
    for folder in ("train", "validation"):
        (path,) = (tmp_path / folder).glob("events.out.tfevents.*")
        events = list(tf.compat.v1.train.summary_iterator(str(path)))  # checks every record's CRCs
        assert events[0].file_version == "brain.Event:2"
        read[folder] = [
            (event.step, value.tag, value.simple_value) for event in events[1:] for value in event.summary.value
        ]
    assert read == {
        "train": [(1, "epoch_loss", 2.5), (2, "epoch_loss", 1.25)],
        "validation": [(1, "epoch_accuracy", 0.25), (2, "epoch_accuracy", 0.5)],
    }
