"""``tf.train.Example`` records of a whole batch, framed as TFRecords, in one compiled pass (numba).

Each row of a batch of feature arrays becomes a record: its length and that length's masked CRC32C, the
serialised ``Example`` (the feature map in sorted key order, as ``SerializeToString(deterministic=True)``
writes it: integers as a packed ``Int64List``, floats as a packed ``FloatList``), and the record's masked
CRC32C. Written with NumPy, or record by record in Python, this was a third of create-data's time on short
documents; compiled it is a few percent. Compiled code is cached beside this module (or elsewhere where that is
read-only: :mod:`.compiled`), so only the first run on a machine pays the compilation.
"""

from __future__ import annotations

import numpy as np

from .. import wire_format as wire
from .compiled import njit

# Why these are written again here rather than taken from :mod:`..wire_format`: numba compiles only numba code, and
# calling back into Python (``google_crc32c``, ``wire.varint``) once per record would cost what compiling saves.
# So the CRC loop, the varint writer and its size are compiled here; the CRC's tables and mask constant are
# :mod:`..wire_format`'s (tested equal to ``google_crc32c`` in tests/data/test_wire.py).
_TABLES = wire.crc32c_tables()  # globals: numba freezes them into the compiled code
_MASK_DELTA = wire.MASK_DELTA


@njit()
def _masked_crc32c(buf, start, end):
    """TFRecord's masked CRC32C of ``buf[start:end]`` (:func:`..wire_format.masked_crc`, compiled)."""
    crc = 0xFFFFFFFF
    i = start
    while i + 8 <= end:
        crc ^= buf[i] | (buf[i + 1] << 8) | (buf[i + 2] << 16) | (np.int64(buf[i + 3]) << 24)
        crc = (_TABLES[7, crc & 0xFF] ^ _TABLES[6, (crc >> 8) & 0xFF] ^ _TABLES[5, (crc >> 16) & 0xFF]
               ^ _TABLES[4, crc >> 24] ^ _TABLES[3, buf[i + 4]] ^ _TABLES[2, buf[i + 5]] ^ _TABLES[1, buf[i + 6]]
               ^ _TABLES[0, buf[i + 7]])
        i += 8
    while i < end:
        crc = _TABLES[0, (crc ^ buf[i]) & 0xFF] ^ (crc >> 8)
        i += 1
    crc ^= 0xFFFFFFFF
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


@njit(inline="always")
def _varint_size(value):
    """Bytes of ``value`` as a protobuf varint (a negative int64 takes ten, as two's complement)."""
    if value < 0:
        return 10
    if value < 0x80:
        return 1
    if value < 0x4000:
        return 2
    size = 3
    value >>= 21
    while value > 0:
        value >>= 7
        size += 1
    return size


@njit(inline="always")
def _put_varint(buf, pos, value):
    if value < 0:  # two's complement, ten bytes
        bits = np.uint64(value)
        while bits >= np.uint64(0x80):
            buf[pos] = np.uint8((bits & np.uint64(0x7F)) | np.uint64(0x80))
            bits >>= np.uint64(7)
            pos += 1
        buf[pos] = np.uint8(bits)
        return pos + 1
    if value < 0x80:
        buf[pos] = value
        return pos + 1
    while value >= 0x80:
        buf[pos] = (value & 0x7F) | 0x80
        value >>= 7
        pos += 1
    buf[pos] = value
    return pos + 1


@njit()
def _put_uint32_le(buf, pos, value):
    for k in range(4):
        buf[pos + k] = (value >> (8 * k)) & 0xFF
    return pos + 4


@njit()
def _payload_size(ints, row, is_float, col, width):
    if is_float:
        return 4 * width
    size = 0
    for c in range(col, col + width):
        size += _varint_size(ints[row, c])
    return size


@njit()
def _entry_sizes(payload, key_length):
    """(value list, feature, entry body) sizes of one map entry whose packed values take ``payload`` bytes."""
    value_list = 1 + _varint_size(payload) + payload
    feature = 1 + _varint_size(value_list) + value_list
    body = 1 + _varint_size(key_length) + key_length + 1 + _varint_size(feature) + feature
    return value_list, feature, body


@njit()
def _encode(ints, floats, is_float, cols, widths, keys, key_starts):
    n, n_features = ints.shape[0], len(widths)
    payloads = np.zeros((n, n_features), dtype=np.int64)
    example_sizes = np.zeros(n, dtype=np.int64)
    offsets = np.zeros(n + 1, dtype=np.int64)
    for row in range(n):
        total = 0
        for f in range(n_features):
            payload = _payload_size(ints, row, is_float[f], cols[f], widths[f])
            payloads[row, f] = payload
            body = _entry_sizes(payload, key_starts[f + 1] - key_starts[f])[2]
            total += 1 + _varint_size(body) + body
        example_sizes[row] = 1 + _varint_size(total) + total
        offsets[row + 1] = offsets[row] + 12 + example_sizes[row] + 4
    buf = np.empty(offsets[n], dtype=np.uint8)
    for row in range(n):
        pos = offsets[row]
        size = example_sizes[row]
        for k in range(8):  # the record's length, little-endian uint64, and its masked CRC
            buf[pos + k] = np.uint8((size >> (8 * k)) & 0xFF)
        pos = _put_uint32_le(buf, pos + 8, _masked_crc32c(buf, pos, pos + 8))
        start = pos
        buf[pos] = 0x0A  # Example.features
        pos = _put_varint(buf, pos + 1, size - 1 - _varint_size(size - 1))
        for f in range(n_features):
            payload = payloads[row, f]
            key_length = key_starts[f + 1] - key_starts[f]
            value_list, feature, body = _entry_sizes(payload, key_length)
            buf[pos] = 0x0A  # a map entry
            pos = _put_varint(buf, pos + 1, body)
            buf[pos] = 0x0A  # its key
            pos = _put_varint(buf, pos + 1, key_length)
            for k in range(key_length):
                buf[pos + k] = keys[key_starts[f] + k]
            pos += key_length
            buf[pos] = 0x12  # its value, a Feature
            pos = _put_varint(buf, pos + 1, feature)
            buf[pos] = 0x12 if is_float[f] else 0x1A  # FloatList or Int64List
            pos = _put_varint(buf, pos + 1, value_list)
            buf[pos] = 0x0A  # packed values
            pos = _put_varint(buf, pos + 1, payload)
            if is_float[f]:
                for c in range(cols[f], cols[f] + widths[f]):
                    pos = _put_uint32_le(buf, pos, floats[row, c])
            else:
                for c in range(cols[f], cols[f] + widths[f]):
                    pos = _put_varint(buf, pos, ints[row, c])
        _put_uint32_le(buf, pos, _masked_crc32c(buf, start, pos))
    return buf, offsets


def encode_framed(batch: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """A batch of feature arrays (one row per example) as framed TFRecords: the bytes of all records one after
    another, and the offsets where each starts (``n + 1`` of them: the last is the end)."""
    names = sorted(batch)
    n = len(batch[names[0]]) if names else 0
    if n == 0:  # a block or a shard that gave no instance (a tiny corpus)
        return np.zeros(0, dtype=np.uint8), np.zeros(1, dtype=np.int64)
    arrays = [np.asarray(batch[name]).reshape(n, -1) for name in names]
    is_float = np.array([np.issubdtype(a.dtype, np.floating) for a in arrays], dtype=np.bool_)
    widths = np.array([a.shape[1] for a in arrays], dtype=np.int64)
    int_arrays = [a for a, f in zip(arrays, is_float, strict=True) if not f]
    float_arrays = [a for a, f in zip(arrays, is_float, strict=True) if f]
    ints = np.hstack(int_arrays).astype(np.int64) if int_arrays else np.zeros((n, 0), dtype=np.int64)
    floats = (np.hstack(float_arrays).astype("<f4") if float_arrays else np.zeros((n, 0), dtype="<f4")).view(np.uint32)
    cols = np.zeros(len(names), dtype=np.int64)
    next_col = [0, 0]
    for f, width in enumerate(widths):
        cols[f] = next_col[int(is_float[f])]
        next_col[int(is_float[f])] += width
    keys = [name.encode() for name in names]
    key_starts = np.concatenate(([0], np.cumsum([len(k) for k in keys]))).astype(np.int64)
    key_bytes = np.frombuffer(b"".join(keys), dtype=np.uint8)
    return _encode(ints, floats, is_float, cols, widths, key_bytes, key_starts)


@njit()
def _gather(buffer, offsets, order):
    sizes = offsets[1:] - offsets[:-1]
    out = np.empty(len(buffer), dtype=np.uint8)
    pos = 0
    for record in order:
        out[pos:pos + sizes[record]] = buffer[offsets[record]:offsets[record + 1]]
        pos += sizes[record]
    return out


def reordered(batches: list[tuple[np.ndarray, np.ndarray]], order: np.ndarray) -> np.ndarray:
    """The framed records of several batches (each as :func:`encode_framed` returns it) in ``order`` (record
    numbers counted across the batches). ``batches`` is emptied once copied, so at most two copies of the
    records are held at a time."""
    if not batches:  # no instance: no record
        return np.zeros(0, dtype=np.uint8)
    buffer = np.concatenate([b for b, _ in batches])
    bases = np.cumsum([0] + [int(o[-1]) for _, o in batches[:-1]])
    offsets = np.concatenate([o[:-1] + base for (_, o), base in zip(batches, bases, strict=True)] + [[len(buffer)]])
    batches.clear()
    return _gather(buffer, offsets.astype(np.int64), np.asarray(order, dtype=np.int64))
