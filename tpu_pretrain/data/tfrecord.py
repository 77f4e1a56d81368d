"""The TFRecord and ``tf.train.Example`` wire formats, written and read without TensorFlow.

Building ``tf.train.Example`` protos one by one in Python runs at about 10,000/s and protobuf's map
order varies between processes. Here whole batches are encoded at once (:mod:`.example_encoder`), with
the feature map in sorted key order (what ``SerializeToString(deterministic=True)`` gives), and framed
as TFRecords (length, masked CRC32C, data, masked CRC32C: :mod:`..wire_format`'s pieces); records are read back and
checked with NumPy and Python. Which features a record holds is the data folder's business (:mod:`.data_folder`).
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from .. import wire_format as wire


def _values(feature: bytes) -> np.ndarray:
    """The values of a ``Feature`` (Int64List as int64, FloatList as float32; packed or not)."""
    for kind, _, payload in wire.proto_fields(feature):
        if kind == 1:
            raise ValueError("BytesList features are not part of this format")
        values: list = []
        for _, wire_type, item in wire.proto_fields(payload):
            if kind == 2:  # FloatList
                values.extend(np.frombuffer(item, "<f4").tolist())
            elif wire_type == wire.LENGTH_DELIMITED:  # packed Int64List
                pos = 0
                while pos < len(item):
                    number, pos = wire.read_varint(item, pos)
                    values.append(wire.signed(number))
            else:
                values.append(wire.signed(item))
        return np.asarray(values, dtype=np.float32 if kind == 2 else np.int64)
    return np.zeros(0, dtype=np.int64)


def decode_example(record: bytes) -> dict[str, np.ndarray]:
    """One serialised ``tf.train.Example`` as ``{feature name: values}`` (for readers without TensorFlow)."""
    out = {}
    for _, _, features in wire.proto_fields(record):  # Example.features
        for _, _, entry in wire.proto_fields(features):  # Features.feature map entries
            parts = {number: value for number, _, value in wire.proto_fields(entry)}
            out[parts[1].decode()] = _values(parts.get(2, b""))
    return out


class AtomicRecordWriter:
    """Writes a TFRecord file under a temporary name; it appears under its real name only when complete."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.tmp_path = self.path.with_name(self.path.name + ".tmp")
        self._file = open(self.tmp_path, "wb")  # noqa: SIM115 - closed in close()/abort()
        self._sha = hashlib.sha256()
        self.records = 0
        self.bytes = 0

    def write_examples(self, batch: dict[str, np.ndarray]) -> None:
        """A batch of feature arrays as ``tf.train.Example`` records, one per row (:mod:`.example_encoder`)."""
        from .example_encoder import encode_framed

        buffer, offsets = encode_framed(batch)
        self.write_framed(buffer, len(offsets) - 1)

    def write_framed(self, chunk: bytes | np.ndarray, count: int) -> None:
        """``count`` records already framed (:func:`.example_encoder.encode_framed`)."""
        self._sha.update(chunk)
        self._file.write(chunk)
        self.bytes += len(chunk)
        self.records += count

    def close(self) -> str:
        """Flush to disk, rename into place; returns the file's sha256."""
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self.tmp_path, self.path)
        return self._sha.hexdigest()

    def abort(self) -> None:
        self._file.close()
        self.tmp_path.unlink(missing_ok=True)


class CorruptRecord(ValueError):
    """A record whose framing or checksum is wrong: the shard is damaged (readers name it with
    :func:`.data_folder.corrupt_shard_error`)."""


def read_records(path: str | os.PathLike) -> Iterable[bytes]:
    """The records of a TFRecord file, each CRC checked (for verification without TensorFlow)."""
    with open(path, "rb") as handle:
        while True:
            header = handle.read(wire.HEADER_SIZE)
            if not header:
                return
            if len(header) < wire.HEADER_SIZE:
                raise CorruptRecord(f"{path}: truncated record header")
            (length,) = struct.unpack("<Q", header[:8])
            if struct.unpack("<I", header[8:])[0] != wire.masked_crc(header[:8]):
                raise CorruptRecord(f"{path}: record header CRC mismatch")
            data = handle.read(length)
            footer = handle.read(wire.FOOTER_SIZE)
            whole = len(data) == length and len(footer) == wire.FOOTER_SIZE
            if not whole or struct.unpack("<I", footer)[0] != wire.masked_crc(data):
                raise CorruptRecord(f"{path}: truncated or corrupt record")
            yield data


# -- reading many records fast: random access and batch decoding ------------------------------------
class RecordFile:
    """Random access to the records of one TFRecord file: an index of their offsets, reads CRC-checked.

    The index is built by walking the record headers (12 bytes each) once; the data stays on disk and
    is read through a memory map, so a reader can take records in any order at the cost of a slice.
    """

    def __init__(self, path: str | os.PathLike):
        import mmap

        self.path = str(path)
        with open(self.path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        offsets, pos = [], 0
        while pos < size:
            if pos + wire.HEADER_SIZE > size:
                raise CorruptRecord(f"{self.path}: truncated record header at byte {pos}")
            (length,) = struct.unpack_from("<Q", self._map, pos)
            offsets.append(pos + wire.HEADER_SIZE)
            pos += wire.HEADER_SIZE + length + wire.FOOTER_SIZE
        if pos != size:
            raise CorruptRecord(f"{self.path}: the last record is truncated")
        self.offsets = np.asarray(offsets, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.offsets)

    def read(self, index: int) -> bytes:
        start = int(self.offsets[index])
        (length,) = struct.unpack_from("<Q", self._map, start - wire.HEADER_SIZE)
        data = self._map[start:start + length]
        if struct.unpack_from("<I", self._map, start + length)[0] != wire.masked_crc(data):
            raise CorruptRecord(f"{self.path}: record {index} is corrupt (CRC mismatch)")
        return data


def _locate_features(record: bytes) -> dict[bytes, tuple[int, int, int]] | None:
    """``{name: (list tag, start, end)}`` of each feature's packed payload, or None for another layout.

    Handles the layout every writer of this schema produces (packed lists, key before value); anything
    else returns None and is decoded by :func:`decode_example`.
    """
    out, pos = {}, 0
    if not record or record[0] != 0x0A:
        return None
    length, pos = wire.read_varint(record, 1)
    end = pos + length
    while pos < end:
        if record[pos] != 0x0A:
            return None
        entry_length, pos = wire.read_varint(record, pos + 1)
        entry_end = pos + entry_length
        if record[pos] != 0x0A:
            return None
        key_length, pos = wire.read_varint(record, pos + 1)
        key, pos = record[pos:pos + key_length], pos + key_length
        if pos >= entry_end or record[pos] != 0x12:
            return None
        _, pos = wire.read_varint(record, pos + 1)  # the Feature's length
        tag = record[pos]
        _, pos = wire.read_varint(record, pos + 1)  # the value list's length
        if pos < entry_end and record[pos] == 0x0A:  # packed values
            payload_length, pos = wire.read_varint(record, pos + 1)
            out[key] = (tag, pos, pos + payload_length)
        elif pos == entry_end:  # an empty list
            out[key] = (tag, pos, pos)
        else:
            return None
        pos = entry_end
    return out


def decode_examples(records: list[bytes], shapes: dict[str, tuple[str, int]]) -> dict[str, np.ndarray]:
    """A batch of ``tf.train.Example`` records as ``{feature: [batch, length] array}``, without TensorFlow.

    ``shapes`` is ``{feature: (dtype, length)}`` (:func:`.data_folder.feature_shapes`). Each record's
    layout is walked in Python; the values of all records are decoded together with NumPy.
    """
    pieces: dict[str, list[bytes]] = {name: [] for name in shapes}
    keys = {name: name.encode() for name in shapes}
    for index, record in enumerate(records):
        found = _locate_features(record)
        if found is None or any(keys[name] not in found for name in shapes):
            example = decode_example(record)  # another layout: the general decoder
            for name, (dtype, _) in shapes.items():
                if name not in example:
                    raise ValueError(f"record {index} has no feature {name!r}")
                values = np.asarray(example[name], dtype="<f4" if dtype == "float32" else np.int64)
                pieces[name].append(values.tobytes() if dtype == "float32" else wire.varints(values))
            continue
        for name in shapes:
            _, start, end = found[keys[name]]
            pieces[name].append(record[start:end])
    out = {}
    for name, (dtype, length) in shapes.items():
        blob = b"".join(pieces[name])
        values = np.frombuffer(blob, dtype="<f4") if dtype == "float32" else wire.decode_varints(blob)
        if values.size != length * len(records):
            raise ValueError(f"feature {name!r}: {values.size} values in {len(records)} records, expected "
                             f"{length} each (are the records of this max_seq_length/max_predictions_per_seq?)")
        out[name] = values.reshape(len(records), length)
    return out

