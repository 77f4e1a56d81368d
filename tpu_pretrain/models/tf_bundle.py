"""Read TensorFlow checkpoints (the ``.index`` + ``.data-NNNNN-of-NNNNN`` "tensor bundle") with NumPy alone.

Colab's TPU image has no TensorFlow, yet continued pretraining starts from Google's released
``bert_model.ckpt``; this reads it without TensorFlow or the protobuf package. The format, as TensorFlow's
``tensor_bundle.cc`` writes it: the ``.index`` file is a LevelDB-format table (uncompressed blocks of
prefix-compressed keys, each block followed by a type byte and a masked crc32c) whose first entry, key
``""``, is a ``BundleHeaderProto`` and whose other entries map tensor names to ``BundleEntryProto``
(dtype, shape, shard, offset, size, masked crc32c of the bytes). The bytes lie in
``prefix.data-{shard:05d}-of-{num_shards:05d}``. Big-endian bundles are byte-swapped, as TensorFlow does.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass
from math import prod
from pathlib import Path

import numpy as np

from ..errors import UserInputError
from ..wire_format import FIXED32, FIXED64, masked_crc, proto_fields, read_varint, signed, unmask

_FOOTER_SIZE = 48  # two block handles padded to 40 bytes, then the 8-byte magic number
_TABLE_MAGIC = 0xDB4775248B80FB57
_BFLOAT16 = 14
# TensorFlow's DataType enum (types.proto) -> the NumPy dtype of the stored bytes (little-endian).
_DTYPES = {1: "<f4", 2: "<f8", 3: "<i4", 4: "u1", 5: "<i2", 6: "i1", 8: "<c8", 9: "<i8", 10: "?",
           _BFLOAT16: "<u2", 17: "<u2", 18: "<c16", 19: "<f2", 22: "<u4", 23: "<u8"}
_UNREADABLE = {7: "string", 11: "qint8", 12: "quint8", 13: "qint32", 15: "qint16", 16: "quint16",
               20: "resource", 21: "variant"}
_SKIPPED = (7, 21)  # string and variant tensors are metadata (e.g. _CHECKPOINTABLE_OBJECT_GRAPH), not weights


class _Corrupt(ValueError):
    """A structural fault in an index; the caller adds the file's name. A ``ValueError``, as :mod:`..wire_format`'s
    readers raise for a varint or a field cut short, so that one ``except`` takes both."""


@dataclass(frozen=True)
class _Entry:
    name: str
    dtype: int
    shape: tuple[int, ...]
    shard: int
    offset: int
    size: int
    crc: int
    slices: int


@dataclass(frozen=True)
class _Bundle:
    prefix: str
    num_shards: int
    big_endian: bool
    entries: dict[str, _Entry]

    def data_path(self, shard: int) -> str:
        return f"{self.prefix}.data-{shard:05d}-of-{self.num_shards:05d}"


def find_bundle_prefix(path: str | os.PathLike) -> str | None:
    """The prefix of the TF checkpoint at ``path`` (a prefix, its ``.index`` or ``.data-*`` file, or a folder), or None.

    A folder is resolved as ``tf.train.latest_checkpoint`` does (its ``checkpoint`` file, a relative path
    taken from the folder), and, when that names nothing present, as the first ``*.index`` in sorted order.
    """
    p = Path(path)
    if p.is_dir():
        latest = _latest_from_pointer(p)
        if latest:
            return latest
        indexes = sorted(p.glob("*.index"))
        return str(indexes[0])[: -len(".index")] if indexes else None
    if Path(f"{p}.index").is_file():
        return str(p)
    if p.suffix == ".index" and p.is_file():
        return str(p)[: -len(".index")]
    data = re.fullmatch(r"(.+)\.data-\d{5}-of-\d{5}", str(p))
    if data and p.is_file() and Path(f"{data[1]}.index").is_file():
        return data[1]
    return None


def _latest_from_pointer(folder: Path) -> str | None:
    """The prefix a folder's ``checkpoint`` file names, when its ``.index`` is present (else None).

    A path recorded elsewhere (an absolute path from another machine or bucket) is also tried by its base
    name in this folder: a copied training folder keeps its pointer file.
    """
    try:
        text = (folder / "checkpoint").read_bytes()
    except OSError:
        return None
    found = re.search(rb'^\s*model_checkpoint_path\s*:\s*(["\'])((?:\\.|(?!\1).)*)\1', text, re.MULTILINE)
    if not found:
        return None
    recorded = _unescape(found[2])
    candidates = [recorded if os.path.isabs(recorded) else os.path.join(folder, recorded)]
    candidates.append(os.path.join(folder, os.path.basename(recorded)))
    return next((c for c in candidates if os.path.isfile(c + ".index")), None)


def _unescape(raw: bytes) -> str:
    """A text-format string's C escapes (octal bytes for non-ASCII paths) -> str."""
    simple = {b"n": b"\n", b"t": b"\t", b"r": b"\r"}

    def one(match: re.Match) -> bytes:
        code = match[1]
        if code[:1] in b"01234567":
            return bytes([int(code, 8) & 0xFF])
        if code[:1] in (b"x", b"X"):
            return bytes([int(code[1:], 16)])
        return simple.get(code, code)

    return re.sub(rb"\\([0-7]{1,3}|[xX][0-9a-fA-F]{1,2}|.)", one, raw).decode("utf-8", "surrogateescape")


def list_tensors(prefix: str | os.PathLike) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """Every tensor's dtype and shape, as :func:`read_tensors` returns it, from the index alone.

    bfloat16 is listed as float32 (what :func:`read_tensors` gives); string and variant tensors as
    ``object``; a partitioned variable by its full shape, as ``tf.train.load_checkpoint`` lists them.
    """
    bundle = _load(prefix)
    return {name: (_result_dtype(e.dtype), e.shape) for name, e in bundle.entries.items()}


def read_tensors(prefix: str | os.PathLike, names: list[str] | None = None) -> dict[str, np.ndarray]:
    """The tensors (all, or those named), each checked against the crc32c the index records.

    bfloat16 tensors come back as float32, exactly (the bits shifted up 16): NumPy has no bfloat16. With
    ``names=None`` string and variant tensors (such as TF2's ``_CHECKPOINTABLE_OBJECT_GRAPH``) are skipped;
    naming one, or any partitioned (sliced) variable, raises :class:`UserInputError`. Each tensor is read
    with one seek and read, so a 1.3 GB checkpoint costs its tensors' memory, not a second copy.
    """
    bundle = _load(prefix)
    index = f"{bundle.prefix}.index"
    if names is None:
        wanted = [e for e in bundle.entries.values() if e.dtype not in _SKIPPED or e.slices]
    else:
        missing = [n for n in names if n not in bundle.entries]
        if missing:
            some = ", ".join(list(bundle.entries)[:5])
            raise UserInputError(f"{index} has no tensor {', '.join(missing)} (it holds {len(bundle.entries)} "
                                 f"tensors, such as {some}).")
        wanted = [bundle.entries[n] for n in dict.fromkeys(names)]
    for entry in wanted:
        _check_readable(entry, index)
    by_shard: dict[int, list[_Entry]] = {}
    for entry in sorted(wanted, key=lambda e: (e.shard, e.offset)):
        by_shard.setdefault(entry.shard, []).append(entry)
    for shard in by_shard:
        if not os.path.isfile(bundle.data_path(shard)):
            raise UserInputError(f"{bundle.data_path(shard)} is missing: copy every file of the checkpoint "
                                 f"({index} and each {os.path.basename(bundle.prefix)}.data-*).")
    out = {}
    for shard, entries in by_shard.items():
        with open(bundle.data_path(shard), "rb") as handle:
            out.update((e.name, _read_one(handle, bundle, e)) for e in entries)
    return {e.name: out[e.name] for e in wanted}


def _check_readable(entry: _Entry, index: str) -> None:
    if entry.slices:
        raise UserInputError(f"{entry.name} in {index} is a partitioned variable saved in {entry.slices} slices (by "
                             "a v1 partitioner, or TF2's MaxShardSizePolicy); reading those is not supported: "
                             "restore it with TensorFlow and save it unpartitioned.")
    if entry.dtype not in _DTYPES:
        kind = _UNREADABLE.get(entry.dtype, f"DataType {entry.dtype}")
        raise UserInputError(f"{entry.name} in {index} is a {kind} tensor; only numeric and bool tensors are "
                             "read (pass names= with the weights you need).")


def _result_dtype(code: int) -> np.dtype:
    if code == _BFLOAT16:
        return np.dtype(np.float32)
    return np.dtype(_DTYPES[code]).newbyteorder("=") if code in _DTYPES else np.dtype(object)


def _read_one(handle, bundle: _Bundle, entry: _Entry) -> np.ndarray:
    """One tensor: one seek and read into its own array, checksummed, then typed (and byte-swapped)."""
    path = bundle.data_path(entry.shard)
    stored = np.dtype(_DTYPES[entry.dtype])
    if entry.size != stored.itemsize * prod(entry.shape):
        raise UserInputError(f"{bundle.prefix}.index is damaged: {entry.name} has {entry.size} bytes recorded for "
                             f"shape {entry.shape}: copy the checkpoint again.")
    file_size = os.fstat(handle.fileno()).st_size
    if entry.offset + entry.size > file_size:
        end = entry.offset + entry.size
        raise UserInputError(f"{path} is truncated: {entry.name} needs bytes {entry.offset}..{end} but the file "
                             f"has {file_size}: copy the checkpoint again.")
    raw = np.empty(entry.size, np.uint8)
    handle.seek(entry.offset)
    if handle.readinto(memoryview(raw)) != entry.size:
        raise UserInputError(f"{path} is truncated: {entry.name} could not be read in full: copy it again.")
    masked = masked_crc(raw)  # of the array itself: no copy
    if masked != entry.crc:
        raise UserInputError(f"{entry.name} in {path} fails its checksum (crc32c {unmask(masked):08x}, the index "
                             f"records {unmask(entry.crc):08x}): the file is damaged: copy the checkpoint again.")
    array = raw.view(stored.newbyteorder(">") if bundle.big_endian else stored).reshape(entry.shape)
    if bundle.big_endian:
        array = array.astype(stored.newbyteorder("="))
    if entry.dtype == _BFLOAT16:
        array = (array.astype(np.uint32) << 16).view(np.float32)
    return array


def _load(prefix: str | os.PathLike) -> _Bundle:
    """The bundle's header and entries; ``prefix`` may also be anything :func:`find_bundle_prefix` takes."""
    resolved = str(prefix) if os.path.isfile(f"{prefix}.index") else find_bundle_prefix(prefix)
    if resolved is None:
        raise UserInputError(f"{prefix} is not a TensorFlow checkpoint: no {prefix}.index (pass the prefix, "
                             "such as .../bert_model.ckpt, or the folder holding it).")
    index = f"{resolved}.index"
    try:
        data = Path(index).read_bytes()
        num_shards, big_endian, entries = _parse_index(data)
    except OSError as error:
        raise UserInputError(f"{index} cannot be read: {error}") from None
    except (ValueError, TypeError) as error:  # _Corrupt or a field cut short; TypeError: a field of the wrong wire type
        raise UserInputError(f"{index} is not a TensorFlow checkpoint index, or is damaged ({error}): copy the "
                             "checkpoint's .index file again.") from None
    return _Bundle(resolved, num_shards, big_endian, entries)


def _parse_index(data: bytes) -> tuple[int, bool, dict[str, _Entry]]:
    """(num_shards, big_endian, entries by name) from an index file's bytes; raises _Corrupt."""
    items = _table_items(data)
    try:
        key, value = next(items)
    except StopIteration:
        raise _Corrupt("the table is empty") from None
    if key != b"":
        raise _Corrupt("no bundle header entry")
    num_shards, big_endian = _parse_header(value)
    entries = {}
    for key, value in items:
        if key.startswith(b"\x00"):
            continue  # one slice of a partitioned variable, keyed by an encoded name; its full entry lists it
        name = key.decode("utf-8", "surrogateescape")
        entry = _parse_entry(name, value)
        if not 0 <= entry.shard < num_shards:
            raise _Corrupt(f"{name} names data shard {entry.shard} of {num_shards}")
        entries[name] = entry
    return num_shards, big_endian, entries


def _table_items(data: bytes):
    """Every (key, value) of a LevelDB-format table, in order: footer -> index block -> data blocks."""
    if len(data) < _FOOTER_SIZE:
        raise _Corrupt(f"{len(data)} bytes, shorter than a table footer")
    footer = data[-_FOOTER_SIZE:]
    if struct.unpack_from("<Q", footer, 40)[0] != _TABLE_MAGIC:
        raise _Corrupt("no table footer at its end: the file is truncated, or another kind of file")
    _, pos = read_varint(footer, read_varint(footer, 0)[1])  # skip the metaindex handle: TF writes no filters
    index_offset, pos = read_varint(footer, pos)
    index_size, _ = read_varint(footer, pos)
    for _, handle in _block_items(_block(data, index_offset, index_size)):
        offset, pos = read_varint(handle, 0)
        yield from _block_items(_block(data, offset, read_varint(handle, pos)[0]))


def _block(data: bytes, offset: int, size: int) -> bytes:
    """A block's contents, after checking its trailer: type byte 0 (uncompressed) and masked crc32c."""
    end = offset + size
    if end + 5 > len(data) - _FOOTER_SIZE:
        raise _Corrupt(f"block at {offset} runs past the end: the file is truncated")
    (stored,) = struct.unpack_from("<I", data, end + 1)
    if masked_crc(data[offset : end + 1]) != stored:
        raise _Corrupt(f"block at {offset} fails its checksum")
    if data[end] != 0:
        raise _Corrupt(f"block at {offset} is compressed (type {data[end]}); TensorFlow writes indexes uncompressed")
    return data[offset:end]


def _block_items(block: bytes):
    """A block's (key, value) pairs: each key shares a prefix with the one before; restart points are not needed."""
    if len(block) < 4:
        raise _Corrupt("block shorter than its restart count")
    (restarts,) = struct.unpack_from("<I", block, len(block) - 4)
    limit = len(block) - 4 * (restarts + 1)
    if limit < 0:
        raise _Corrupt("block restart array larger than the block")
    pos, key = 0, b""
    while pos < limit:
        shared, pos = read_varint(block, pos)
        unshared, pos = read_varint(block, pos)
        length, pos = read_varint(block, pos)
        if shared > len(key) or pos + unshared + length > limit:
            raise _Corrupt("block entry out of bounds")
        key = key[:shared] + block[pos : pos + unshared]
        pos += unshared
        yield key, block[pos : pos + length]
        pos += length


def _fields(buf: bytes):
    """A protobuf message's (field number, value): an int for varint/fixed fields, bytes for length-delimited."""
    for number, wire, value in proto_fields(buf):
        yield number, int.from_bytes(value, "little") if wire in (FIXED64, FIXED32) else value


def _parse_header(buf: bytes) -> tuple[int, bool]:
    """BundleHeaderProto: num_shards = 1, endianness = 2 (BIG = 1), version = 3 (a VersionDef)."""
    fields = list(_fields(buf))
    num_shards = next((v for n, v in fields if n == 1), 0)
    big_endian = next((v for n, v in fields if n == 2), 0) == 1
    version = next((v for n, v in fields if n == 3), b"")
    if num_shards < 1 or not isinstance(version, bytes):
        raise _Corrupt("not a bundle header")
    min_consumer = next((v for n, v in _fields(version) if n == 2), 0)
    if min_consumer > 1:
        raise _Corrupt(f"the bundle needs a reader of format version {min_consumer}; this one reads version 1")
    return num_shards, big_endian


def _parse_entry(name: str, buf: bytes) -> _Entry:
    """BundleEntryProto: dtype 1, shape 2, shard_id 3, offset 4, size 5, crc32c 6 (fixed32), slices 7."""
    values = {1: 0, 3: 0, 4: 0, 5: 0, 6: 0}
    shape: list[int] = []
    slices = 0
    for number, value in _fields(buf):
        if number == 2:
            for dim_field, dim in _fields(value):
                if dim_field == 3 and dim:
                    raise _Corrupt(f"{name} has an unknown rank")
                if dim_field == 2:
                    shape.append(signed(next((v for n, v in _fields(dim) if n == 1), 0)))
        elif number == 7:
            slices += 1
        elif number in values:
            values[number] = value
    if any(d < 0 for d in shape) or any(isinstance(v, bytes) for v in values.values()):
        raise _Corrupt(f"{name} has a malformed entry")
    return _Entry(name, values[1], tuple(shape), values[3], signed(values[4]), signed(values[5]), values[6], slices)
