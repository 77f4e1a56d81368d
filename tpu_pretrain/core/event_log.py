"""TensorBoard scalars written without TensorFlow, so every backend logs its curves the same way.

An event file is a TFRecord file of ``Event`` protos: the first says the file version, each later one
holds a step's scalars as ``Summary.Value.simple_value``, which TensorBoard and :mod:`..export.plots`
read. The few protobuf fields are encoded with :mod:`..wire_format`.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from pathlib import Path

from ..wire_format import FIXED32, FIXED64, VARINT, frame_record, length_delimited, tag, varint
from .run_folder import RunFolder

SPLITS = ("train", "eval")


def encode_event(wall_time: float, step: int, scalars: dict | None = None, file_version: str | None = None) -> bytes:
    """An ``Event``: wall_time (1, double), step (2), file_version (3) or summary (5) of simple values."""
    out = tag(1, FIXED64) + struct.pack("<d", wall_time) + tag(2, VARINT) + varint(step)
    if file_version is not None:
        out += length_delimited(3, file_version.encode())
    if scalars:
        values = b"".join(length_delimited(1, length_delimited(1, name.encode()) + tag(2, FIXED32)
                                           + struct.pack("<f", value)) for name, value in scalars.items())
        out += length_delimited(5, values)  # Summary.value: tag (1), simple_value (2, float)
    return out


class EventFile:
    """One TensorBoard event file, appended to and flushed after each write."""

    def __init__(self, folder: str | os.PathLike):
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"events.out.tfevents.{time.time():.6f}.{socket.gethostname()}.{os.getpid()}"
        self._file = open(self.path, "ab")  # noqa: SIM115 - closed in close()
        self._append(encode_event(time.time(), 0, file_version="brain.Event:2"))

    def _append(self, event: bytes) -> None:
        self._file.write(frame_record(event))
        self._file.flush()

    def write(self, step: int, scalars: dict) -> None:
        self._append(encode_event(time.time(), step, {k: float(v) for k, v in scalars.items()}))

    def close(self) -> None:
        self._file.close()


class ScalarLog:
    """The run's train and eval curves (``logs/train``, ``logs/eval``) as TensorBoard scalars."""

    def __init__(self, run: RunFolder, enabled: bool = True):
        self.files = {split: EventFile(run.logs / split) for split in SPLITS} if enabled else {}

    def write(self, split: str, metrics: dict, step: int) -> None:
        if self.files:  # disabled on a worker other than the chief, which writes the run's logs
            self.files[split].write(step, metrics)

    def close(self) -> None:
        for file in self.files.values():
            file.close()
