"""The TFRecord and ``tf.train.Example`` wire formats, written and read without TensorFlow.

Building ``tf.train.Example`` protos one by one in Python runs at about 10,000/s and protobuf's map
order varies between processes. Here the ``Example`` wire format is encoded directly from NumPy
batches, with the feature map in sorted key order (what ``SerializeToString(deterministic=True)``
gives), and framed as TFRecords (length, masked CRC32C, data, masked CRC32C). Float arrays become
``FloatList`` features, integer arrays ``Int64List``; which features a record holds is the data
folder's business (:mod:`.data_folder`), not this module's.
"""

from __future__ import annotations

import functools
import hashlib
import os
import struct
from collections.abc import Iterable
from pathlib import Path

import google_crc32c
import numpy as np


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_SMALL_VARINTS = [_varint(i) for i in range(1 << 14)]


def _len_prefix(length: int) -> bytes:
    return _SMALL_VARINTS[length] if length < (1 << 14) else _varint(length)


def _varint_rows(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row of a non-negative int matrix as protobuf packed varints: all rows' bytes one after another, and
    each row's byte count (vectorised over the batch, one pass per byte a value may need)."""
    largest = int(values.max()) if values.size else 0
    negative = values.size and int(values.min()) < 0  # ten bytes each (two's complement), as protobuf writes them
    if largest < 0x80 and not negative:  # masks, segment ids, positions, labels: the values are the bytes
        return values.astype(np.uint8).reshape(-1), np.full(len(values), values.shape[1], dtype=np.int64)
    small = largest < 1 << 32 and not negative
    v = values.reshape(-1).astype(np.uint32 if small else np.uint64, copy=False)
    largest = largest if not negative else (1 << 64) - 1
    nbytes = np.ones(v.shape, dtype=np.int64)
    planes = 1
    while largest >= 1 << (7 * planes):
        nbytes += v >= (1 << (7 * planes))
        planes += 1
    starts = np.cumsum(nbytes) - nbytes
    out = np.empty(int(starts[-1] + nbytes[-1]) if v.size else 0, dtype=np.uint8)
    for k in range(planes):
        at = slice(None) if k == 0 else nbytes > k
        group = ((v[at] >> (7 * k)) & 0x7F).astype(np.uint8)
        out[starts[at] + k] = group | np.where(nbytes[at] > k + 1, np.uint8(0x80), np.uint8(0))
    return out, nbytes.reshape(values.shape).sum(axis=1)


@functools.lru_cache(maxsize=4096)
def _entry_head(name: str, is_float: bool, payload_length: int) -> bytes:
    """Everything of one ``map<string, Feature>`` entry that precedes its packed values.

    The entry is: key, then Feature{Int64List|FloatList{packed values}}. Only the payload length
    varies between examples, so the head is cached per (feature, length).
    """
    key = name.encode()
    list_tag = b"\x12" if is_float else b"\x1a"
    value_list_head = b"\x0a" + _len_prefix(payload_length)
    feature_length = len(value_list_head) + payload_length
    feature_head = list_tag + _len_prefix(feature_length) + value_list_head
    body_head = b"\x0a" + _len_prefix(len(key)) + key + b"\x12" + _len_prefix(len(feature_head) + payload_length) \
        + feature_head
    return b"\x0a" + _len_prefix(len(body_head) + payload_length) + body_head


def _rows_of(pieces: list[bytes], which: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row ``i`` is ``pieces[which[i]]``: all rows' bytes one after another, and each row's byte count."""
    lengths = np.array([len(p) for p in pieces], dtype=np.int64)
    table = np.zeros((len(pieces), max(int(lengths.max()), 1)), dtype=np.uint8)
    for i, piece in enumerate(pieces):
        table[i, :len(piece)] = np.frombuffer(piece, dtype=np.uint8)
    rows = table[which]
    return rows[np.arange(table.shape[1])[None, :] < lengths[which][:, None]], lengths[which]


def _payload(values: np.ndarray, is_float: bool) -> tuple[np.ndarray, np.ndarray]:
    """A feature's packed values for every row: bytes one after another, and each row's byte count."""
    if not is_float:
        return _varint_rows(values)
    raw = np.ascontiguousarray(values, dtype="<f4").view(np.uint8).reshape(-1)
    return raw, np.full(len(values), values.shape[1] * 4, dtype=np.int64)


def encode_examples(batch: dict[str, np.ndarray]) -> list[bytes]:
    """Serialised ``tf.train.Example``s for a batch of feature arrays (one row per example).

    Float arrays are written as ``FloatList``, integer arrays (non-negative) as ``Int64List``. The whole batch is
    laid out in one buffer at once: each example is a sequence of segments (its tag and length, then per feature
    the entry's head and its packed values), every segment's bytes are copied to their places in one scatter per
    segment kind, and the buffer is cut into examples.
    """
    names = sorted(batch)
    n = len(batch[names[0]])
    segments = []  # per kind: (bytes of every row one after another, each row's count)
    for name in names:
        values = np.asarray(batch[name]).reshape(n, -1)
        is_float = np.issubdtype(values.dtype, np.floating)
        payload, lengths = _payload(values, is_float)
        sizes, which = np.unique(lengths, return_inverse=True)
        segments += [_rows_of([_entry_head(name, is_float, int(size)) for size in sizes], which), (payload, lengths)]
    features_length = sum(lengths for _, lengths in segments)
    sizes, which = np.unique(features_length, return_inverse=True)
    segments.insert(0, _rows_of([b"\x0a" + _len_prefix(int(size)) for size in sizes], which))
    sizes = sum(lengths for _, lengths in segments)
    ends = np.cumsum(sizes)
    out = np.empty(int(ends[-1]) if n else 0, dtype=np.uint8)
    offset = ends - sizes  # where each row's next segment goes
    for data, lengths in segments:
        sources = np.cumsum(lengths) - lengths
        out[np.repeat(offset - sources, lengths) + np.arange(len(data))] = data
        offset = offset + lengths
    buffer = out.tobytes()
    return [buffer[a:b] for a, b in zip((ends - sizes).tolist(), ends.tolist(), strict=True)]


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """``(value, position after it)``; an ``IndexError`` when ``data`` ends inside it."""
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def proto_fields(data: bytes):
    """(field number, wire type, value) of a protobuf message: varints as ints, length-delimited and fixed-width
    fields as bytes; a ``ValueError`` (or ``IndexError`` inside a varint) when the message is cut short."""
    pos = 0
    while pos < len(data):
        key, pos = read_varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = read_varint(data, pos)
        elif wire == 2:
            length, pos = read_varint(data, pos)
            value, pos = data[pos:pos + length], pos + length
        elif wire == 5:
            value, pos = data[pos:pos + 4], pos + 4
        elif wire == 1:
            value, pos = data[pos:pos + 8], pos + 8
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if pos > len(data):
            raise ValueError(f"protobuf field {number} runs past the end of its message")
        yield number, wire, value


def _values(feature: bytes) -> np.ndarray:
    """The values of a ``Feature`` (Int64List as int64, FloatList as float32; packed or not)."""
    for kind, _, payload in proto_fields(feature):
        if kind == 1:
            raise ValueError("BytesList features are not part of this format")
        values: list = []
        for _, wire, item in proto_fields(payload):
            if kind == 2:  # FloatList
                values.extend(np.frombuffer(item, "<f4").tolist())
            elif wire == 2:  # packed Int64List
                pos = 0
                while pos < len(item):
                    number, pos = read_varint(item, pos)
                    values.append(number - (1 << 64) if number >= 1 << 63 else number)
            else:
                values.append(item - (1 << 64) if item >= 1 << 63 else item)
        return np.asarray(values, dtype=np.float32 if kind == 2 else np.int64)
    return np.zeros(0, dtype=np.int64)


def decode_example(record: bytes) -> dict[str, np.ndarray]:
    """One serialised ``tf.train.Example`` as ``{feature name: values}`` (for readers without TensorFlow)."""
    out = {}
    for _, _, features in proto_fields(record):  # Example.features
        for _, _, entry in proto_fields(features):  # Features.feature map entries
            parts = {number: value for number, _, value in proto_fields(entry)}
            out[parts[1].decode()] = _values(parts.get(2, b""))
    return out


def _masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


@functools.lru_cache(maxsize=4096)
def _frame_head(length: int) -> bytes:
    header = struct.pack("<Q", length)
    return header + struct.pack("<I", _masked_crc(header))


def frame_record(data: bytes) -> bytes:
    return _frame_head(len(data)) + data + struct.pack("<I", _masked_crc(data))


class AtomicRecordWriter:
    """Writes a TFRecord file under a temporary name; it appears under its real name only when complete."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.tmp_path = self.path.with_name(self.path.name + ".tmp")
        self._file = open(self.tmp_path, "wb")  # noqa: SIM115 - closed in close()/abort()
        self._sha = hashlib.sha256()
        self.records = 0
        self.bytes = 0

    def write_all(self, records: list[bytes]) -> None:
        chunk = b"".join([part for r in records
                          for part in (_frame_head(len(r)), r, struct.pack("<I", _masked_crc(r)))])
        self._sha.update(chunk)
        self._file.write(chunk)
        self.bytes += len(chunk)
        self.records += len(records)

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


def read_records(path: str | os.PathLike) -> Iterable[bytes]:
    """The records of a TFRecord file, each CRC checked (for verification without TensorFlow)."""
    with open(path, "rb") as handle:
        while True:
            header = handle.read(12)
            if not header:
                return
            if len(header) < 12:
                raise ValueError(f"{path}: truncated record header")
            (length,) = struct.unpack("<Q", header[:8])
            if struct.unpack("<I", header[8:])[0] != _masked_crc(header[:8]):
                raise ValueError(f"{path}: record header CRC mismatch")
            data = handle.read(length)
            footer = handle.read(4)
            if len(data) < length or len(footer) < 4 or struct.unpack("<I", footer)[0] != _masked_crc(data):
                raise ValueError(f"{path}: truncated or corrupt record")
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
            if pos + 12 > size:
                raise ValueError(f"{self.path}: truncated record header at byte {pos}")
            (length,) = struct.unpack_from("<Q", self._map, pos)
            offsets.append(pos + 12)
            pos += 12 + length + 4
        if pos != size:
            raise ValueError(f"{self.path}: the last record is truncated")
        self.offsets = np.asarray(offsets, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.offsets)

    def read(self, index: int) -> bytes:
        start = int(self.offsets[index])
        (length,) = struct.unpack_from("<Q", self._map, start - 12)
        data = self._map[start:start + length]
        if struct.unpack_from("<I", self._map, start + length)[0] != _masked_crc(data):
            raise ValueError(f"{self.path}: record {index} is corrupt (CRC mismatch)")
        return data


def _locate_features(record: bytes) -> dict[bytes, tuple[int, int, int]] | None:
    """``{name: (list tag, start, end)}`` of each feature's packed payload, or None for another layout.

    Handles the layout every writer of this schema produces (packed lists, key before value); anything
    else returns None and is decoded by :func:`decode_example`.
    """
    out, pos = {}, 0
    if not record or record[0] != 0x0A:
        return None
    length, pos = read_varint(record, 1)
    end = pos + length
    while pos < end:
        if record[pos] != 0x0A:
            return None
        entry_length, pos = read_varint(record, pos + 1)
        entry_end = pos + entry_length
        if record[pos] != 0x0A:
            return None
        key_length, pos = read_varint(record, pos + 1)
        key, pos = record[pos:pos + key_length], pos + key_length
        if pos >= entry_end or record[pos] != 0x12:
            return None
        _, pos = read_varint(record, pos + 1)  # the Feature's length
        tag = record[pos]
        _, pos = read_varint(record, pos + 1)  # the value list's length
        if pos < entry_end and record[pos] == 0x0A:  # packed values
            payload_length, pos = read_varint(record, pos + 1)
            out[key] = (tag, pos, pos + payload_length)
        elif pos == entry_end:  # an empty list
            out[key] = (tag, pos, pos)
        else:
            return None
        pos = entry_end
    return out


def _decode_varints(blob: bytes) -> np.ndarray:
    """Every varint in ``blob``, decoded at once (int64, two's complement as protobuf's int64)."""
    data = np.frombuffer(blob, dtype=np.uint8)
    ends = np.flatnonzero(data < 0x80)
    starts = np.concatenate(([0], ends[:-1] + 1)).astype(np.int64)
    within = np.arange(len(data), dtype=np.int64) - np.repeat(starts, ends - starts + 1)
    parts = (data & 0x7F).astype(np.uint64) << (within.astype(np.uint64) * np.uint64(7))
    return np.add.reduceat(parts, starts).view(np.int64) if len(data) else np.zeros(0, np.int64)


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
                pieces[name].append(values.tobytes() if dtype == "float32" else _varint_bytes(values))
            continue
        for name in shapes:
            _, start, end = found[keys[name]]
            pieces[name].append(record[start:end])
    out = {}
    for name, (dtype, length) in shapes.items():
        blob = b"".join(pieces[name])
        values = np.frombuffer(blob, dtype="<f4") if dtype == "float32" else _decode_varints(blob)
        if values.size != length * len(records):
            raise ValueError(f"feature {name!r}: {values.size} values in {len(records)} records, expected "
                             f"{length} each (are the records of this max_seq_length/max_predictions_per_seq?)")
        out[name] = values.reshape(len(records), length)
    return out


def _varint_bytes(values: np.ndarray) -> bytes:
    return b"".join(_varint(int(v) & ((1 << 64) - 1)) for v in values)
