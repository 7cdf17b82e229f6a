"""TensorBoard scalars written without TensorFlow: the event files TensorBoard's Scalars tab reads.

The train job on TensorFlow writes its epoch scalars with ``tf.summary``; on
JAX there is no TensorFlow (and usually no tensorboard package), so
``EventFileScalars`` writes the same folders (``train``, ``validation``,
``test``) and tags itself. An event file is a TFRecord file: each record is
its length (uint64, little-endian), the masked CRC-32C of those 8 bytes, the
bytes of one ``tensorflow.Event`` protocol buffer, and their masked CRC-32C.
The first event holds ``file_version: "brain.Event:2"``; each scalar is an
event with ``wall_time``, ``step`` and a ``Summary`` of one ``simple_value``,
which TensorBoard reads as a scalar. The few protocol-buffer fields needed
are encoded by hand: nothing here imports a framework or protobuf.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from pathlib import Path

FOLDERS = {"train": "train", "val": "validation", "test": "test"}
"""Split → folder, as the TensorFlow job's writers name them (TensorBoard shows one run per folder)."""
FILE_VERSION = b"brain.Event:2"
_CRC_MASK_DELTA = 0xA282EAD8


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as TFRecord frames use it; a scalar's event is a few dozen bytes."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _CRC_MASK_DELTA) & 0xFFFFFFFF


def record(data: bytes) -> bytes:
    """``data`` framed as one TFRecord."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc(length)) + data + struct.pack("<I", masked_crc(data))


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        bits, value = value & 0x7F, value >> 7
        out.append(bits | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2): a string or a nested message."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def event(wall_time: float, step: int = 0, *, file_version: bytes | None = None, summary: bytes | None = None) -> bytes:
    """One ``Event``: wall_time (1, double), step (2, int64), file_version (3) or summary (5)."""
    encoded = _varint(1 << 3 | 1) + struct.pack("<d", wall_time) + _varint(2 << 3 | 0) + _varint(max(0, int(step)))
    if file_version is not None:
        encoded += _field(3, file_version)
    if summary is not None:
        encoded += _field(5, summary)
    return encoded


def scalar_summary(tag: str, value: float) -> bytes:
    """A ``Summary`` of one ``Value``: tag (1) and simple_value (2, float)."""
    value_message = _field(1, tag.encode()) + _varint(2 << 3 | 5) + struct.pack("<f", float(value))
    return _field(1, value_message)


class EventFileScalars:
    """Scalars for TensorBoard under ``logdir/<folder>``, one event file per split, flushed as written."""

    def __init__(self, logdir: Path):
        self.logdir = Path(logdir)
        self.files: dict[str, Path] = {}

    def _file(self, split: str) -> Path:
        if split not in self.files:
            folder = self.logdir / FOLDERS[split]
            folder.mkdir(parents=True, exist_ok=True)
            # TensorBoard finds event files by "tfevents" in the name; the rest keeps two writers' files apart.
            path = folder / f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}.v2"
            path.write_bytes(record(event(time.time(), file_version=FILE_VERSION)))
            self.files[split] = path
        return self.files[split]

    def write(self, split: str, tag: str, value: float, step: int) -> None:
        with self._file(split).open("ab") as file:
            file.write(record(event(time.time(), step, summary=scalar_summary(tag, value))))

    def close(self) -> None:
        """Nothing is held open: every scalar is appended and closed as it is written."""
