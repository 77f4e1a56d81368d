"""The protobuf and TFRecord wire formats, in one place: varints, fields, record framing, TensorFlow's masked CRC32C.

Three formats are written or read here without TensorFlow or the protobuf package: the data's TFRecords of
``tf.train.Example`` (:mod:`.data.tfrecord`), TensorBoard's event files (:mod:`.core.event_log`) and TensorFlow
checkpoint indexes (:mod:`.models.tf_bundle`). They share these pieces. The CRC is ``google_crc32c``'s; the
compiled encoder (:mod:`.data.example_encoder`) cannot call it from numba, so it takes its tables from
:func:`crc32c_tables`, which are read off ``google_crc32c`` too.
"""

from __future__ import annotations

import functools
import struct

import google_crc32c
import numpy as np

# Wire types (the low three bits of a field's tag).
VARINT, FIXED64, LENGTH_DELIMITED, FIXED32 = 0, 1, 2, 5
HEADER_SIZE = 12  # a TFRecord's header: the data's length (uint64, little-endian), that length's masked CRC
FOOTER_SIZE = 4  # a TFRecord's footer: the data's masked CRC
MASK_DELTA = 0xA282EAD8  # what TensorFlow adds to a rotated CRC32C (:func:`mask`)
_UINT64 = (1 << 64) - 1


# -- varints ------------------------------------------------------------------------------------------------
def varint(value: int) -> bytes:
    """``value`` as a protobuf varint; a negative one as int64's two's complement (ten bytes)."""
    value &= _UINT64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def varints(values: np.ndarray) -> bytes:
    """Each of ``values`` as a varint, one after another (a packed repeated int64 field's payload)."""
    return b"".join(map(varint, np.asarray(values).tolist()))


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """``(value, position after it)``, the value unsigned (:func:`signed` for int64); a ``ValueError`` when
    ``data`` ends inside it."""
    value = shift = 0
    try:
        while True:
            byte = data[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value, pos
            shift += 7
    except IndexError:
        raise ValueError(f"a varint runs past the end of its {len(data)} bytes") from None


def signed(value: int) -> int:
    """An unsigned varint's value as int64 (a negative number is stored as its ten-byte two's complement)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def decode_varints(blob: bytes) -> np.ndarray:
    """Every varint in ``blob``, decoded at once with NumPy (int64, two's complement as protobuf's int64)."""
    data = np.frombuffer(blob, dtype=np.uint8)
    if not len(data):
        return np.zeros(0, np.int64)
    ends = np.flatnonzero(data < 0x80)
    starts = np.concatenate(([0], ends[:-1] + 1)).astype(np.int64)
    within = np.arange(len(data), dtype=np.int64) - np.repeat(starts, ends - starts + 1)
    parts = (data & 0x7F).astype(np.uint64) << (within.astype(np.uint64) * np.uint64(7))
    return np.add.reduceat(parts, starts).view(np.int64)


# -- fields -------------------------------------------------------------------------------------------------
def tag(number: int, wire_type: int) -> bytes:
    """A field's tag: its number and wire type, as the varint that starts it."""
    return varint(number << 3 | wire_type)


def length_delimited(number: int, payload: bytes) -> bytes:
    """Field ``number`` holding ``payload`` (bytes, a string or an embedded message)."""
    return tag(number, LENGTH_DELIMITED) + varint(len(payload)) + payload


def proto_fields(data: bytes):
    """(field number, wire type, value) of a protobuf message: varints as ints, length-delimited and fixed-width
    fields as bytes; a ``ValueError`` when the message is cut short or holds a group (wire types 3, 4)."""
    pos = 0
    while pos < len(data):
        key, pos = read_varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == VARINT:
            value, pos = read_varint(data, pos)
        elif wire == LENGTH_DELIMITED:
            length, pos = read_varint(data, pos)
            value, pos = data[pos:pos + length], pos + length
        elif wire == FIXED32:
            value, pos = data[pos:pos + 4], pos + 4
        elif wire == FIXED64:
            value, pos = data[pos:pos + 8], pos + 8
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if pos > len(data):
            raise ValueError(f"protobuf field {number} runs past the end of its message")
        yield number, wire, value


# -- TensorFlow's masked CRC32C and TFRecord framing --------------------------------------------------------
def mask(crc: int) -> int:
    """TensorFlow's mask of a CRC32C (rotate right by 15, add a constant): a CRC stored beside the bytes it
    covers would otherwise make the CRC of the two together trivial."""
    return (((crc >> 15) | (crc << 17)) + MASK_DELTA) & 0xFFFFFFFF


def unmask(masked: int) -> int:
    """The CRC32C that :func:`mask` made ``masked`` from."""
    rotated = (masked - MASK_DELTA) & 0xFFFFFFFF
    return ((rotated >> 17) | (rotated << 15)) & 0xFFFFFFFF


def masked_crc(data) -> int:
    """The masked CRC32C of ``data`` (bytes or a contiguous NumPy array) as TFRecords and checkpoints store it."""
    return mask(google_crc32c.value(data))


@functools.lru_cache(maxsize=4096)
def _frame_head(length: int) -> bytes:
    header = struct.pack("<Q", length)
    return header + struct.pack("<I", masked_crc(header))


def frame_record(data: bytes) -> bytes:
    """``data`` framed as one TFRecord: its length, that length's masked CRC, the data, the data's masked CRC."""
    return _frame_head(len(data)) + data + struct.pack("<I", masked_crc(data))


@functools.cache
def crc32c_tables() -> np.ndarray:
    """CRC32C tables for compiled code, eight bytes a step ("slicing by 8"), computed once from ``google_crc32c``.

    Row ``k`` maps a byte to the CRC register (starting at zero, neither inverted) after that byte and ``k`` zero
    bytes; ``google_crc32c.extend`` inverts the register on the way in and out, hence the ``~``.
    """
    tables = np.zeros((8, 256), dtype=np.int64)
    for k in range(8):
        for byte in range(256):
            tables[k, byte] = ~google_crc32c.extend(0xFFFFFFFF, bytes([byte]) + bytes(k)) & 0xFFFFFFFF
    tables.flags.writeable = False
    return tables
