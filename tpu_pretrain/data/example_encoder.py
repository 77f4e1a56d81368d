"""``tf.train.Example`` records of a whole batch, framed as TFRecords, in one compiled pass (numba).

Each row of a batch of feature arrays becomes a record: its length and that length's masked CRC32C, the
serialised ``Example`` (the feature map in sorted key order, as ``SerializeToString(deterministic=True)``
writes it: integers as a packed ``Int64List``, floats as a packed ``FloatList``), and the record's masked
CRC32C. Written with NumPy, or record by record in Python, this was a third of create-data's time on short
documents; compiled it is a few percent. Compiled code is cached beside this module (or in numba's user cache
where that is read-only), so only the first run on a machine pays the compilation.
"""

from __future__ import annotations

import numba
import numpy as np

_CRC32C_POLY = 0x82F63B78  # Castagnoli, reflected


def _crc32c_table() -> np.ndarray:
    table = np.zeros(256, dtype=np.uint32)
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ _CRC32C_POLY if crc & 1 else crc >> 1
        table[byte] = crc
    return table


_TABLE = _crc32c_table()


@numba.njit(cache=True)
def _masked_crc32c(buf, start, end):
    """TFRecord's masked CRC32C of ``buf[start:end]``."""
    crc = np.uint32(0xFFFFFFFF)
    for i in range(start, end):
        crc = _TABLE[(crc ^ buf[i]) & 0xFF] ^ (crc >> np.uint32(8))
    crc = crc ^ np.uint32(0xFFFFFFFF)
    return ((crc >> np.uint32(15)) | (crc << np.uint32(17))) + np.uint32(0xA282EAD8)


@numba.njit(cache=True)
def _varint_size(value):
    """Bytes of ``value`` as a protobuf varint (a negative int64 takes ten, as two's complement)."""
    if value < 0:
        return 10
    size = 1
    while value >= 0x80:
        value >>= 7
        size += 1
    return size


@numba.njit(cache=True)
def _put_varint(buf, pos, value):
    bits = np.uint64(value)  # two's complement for negatives
    while bits >= np.uint64(0x80):
        buf[pos] = np.uint8((bits & np.uint64(0x7F)) | np.uint64(0x80))
        bits >>= np.uint64(7)
        pos += 1
    buf[pos] = np.uint8(bits)
    return pos + 1


@numba.njit(cache=True)
def _put_uint32_le(buf, pos, value):
    for k in range(4):
        buf[pos + k] = np.uint8((value >> np.uint32(8 * k)) & np.uint32(0xFF))
    return pos + 4


@numba.njit(cache=True)
def _payload_size(ints, floats, row, is_float, col, width):
    if is_float:
        return 4 * width
    size = 0
    for c in range(col, col + width):
        size += _varint_size(ints[row, c])
    return size


@numba.njit(cache=True)
def _entry_sizes(payload, key_length):
    """(value list, feature, entry body) sizes of one map entry whose packed values take ``payload`` bytes."""
    value_list = 1 + _varint_size(payload) + payload
    feature = 1 + _varint_size(value_list) + value_list
    body = 1 + _varint_size(key_length) + key_length + 1 + _varint_size(feature) + feature
    return value_list, feature, body


@numba.njit(cache=True)
def _encode(ints, floats, is_float, cols, widths, keys, key_starts):
    n, n_features = ints.shape[0], len(widths)
    payloads = np.zeros((n, n_features), dtype=np.int64)
    example_sizes = np.zeros(n, dtype=np.int64)
    offsets = np.zeros(n + 1, dtype=np.int64)
    for row in range(n):
        total = 0
        for f in range(n_features):
            payload = _payload_size(ints, floats, row, is_float[f], cols[f], widths[f])
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
            buf[pos:pos + key_length] = keys[key_starts[f]:key_starts[f + 1]]
            pos += key_length
            buf[pos] = 0x12  # its value, a Feature
            pos = _put_varint(buf, pos + 1, feature)
            buf[pos] = 0x12 if is_float[f] else 0x1A  # FloatList or Int64List
            pos = _put_varint(buf, pos + 1, value_list)
            buf[pos] = 0x0A  # packed values
            pos = _put_varint(buf, pos + 1, payload)
            for c in range(cols[f], cols[f] + widths[f]):
                if is_float[f]:
                    pos = _put_uint32_le(buf, pos, floats[row, c])
                else:
                    pos = _put_varint(buf, pos, ints[row, c])
        _put_uint32_le(buf, pos, _masked_crc32c(buf, start, pos))
    return buf, offsets


def encode_framed(batch: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """A batch of feature arrays (one row per example) as framed TFRecords: the bytes of all records one after
    another, and the offsets where each starts (``n + 1`` of them: the last is the end)."""
    names = sorted(batch)
    n = len(batch[names[0]]) if names else 0
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


@numba.njit(cache=True)
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
    buffer = np.concatenate([b for b, _ in batches]) if batches else np.zeros(0, dtype=np.uint8)
    bases = np.cumsum([0] + [int(o[-1]) for _, o in batches[:-1]])
    offsets = np.concatenate([o[:-1] + base for (_, o), base in zip(batches, bases, strict=True)] + [[len(buffer)]])
    batches.clear()
    return _gather(buffer, offsets.astype(np.int64), np.asarray(order, dtype=np.int64))
