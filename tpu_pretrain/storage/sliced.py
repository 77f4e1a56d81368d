"""One large file moved as parallel slices: composite uploads and ranged downloads.

A single stream leaves most of a connection idle on a large checkpoint or shard. Uploads send parts
as separate objects in parallel and compose them into the final object (the server computes the
composite CRC32C, checked against the file's); downloads fetch byte ranges in parallel into a
temporary file that is renamed only when its CRC32C matches. The final name never shows a partial
object or file. Parts already on the server with the right CRC32C are reused, so a re-run after a
failure sends only the parts that are missing; they are deleted once composed.
"""

from __future__ import annotations

import base64
import math
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from . import checksums
from .errors import ChecksumMismatchError, explain
from .gcs import PART_MARK, bucket, explain_error, retry
from .local import atomic_open

MAX_COMPOSE_SOURCES = 32  # Cloud Storage composes at most 32 objects in one request


def _slices(size: int, slice_size: int, most: int | None = None) -> list[tuple[int, int]]:
    if most:
        slice_size = max(slice_size, math.ceil(size / most))
    return [(start, min(start + slice_size, size)) for start in range(0, size, slice_size)]


class _Progress:
    def __init__(self, on_position: Callable[[int], None] | None):
        self.position, self.on_position, self.lock = 0, on_position, threading.Lock()

    def add(self, n: int) -> None:
        with self.lock:
            self.position += n
            if self.on_position:
                self.on_position(self.position)


def composite_upload(local: str, dest, crc: str, size: int, workers: int, slice_size: int,
                     on_position: Callable[[int], None] | None = None) -> tuple[int, int]:
    """Upload ``local`` as parallel parts composed into ``dest``; return (bytes sent, parts sent)."""
    target_bucket = bucket(dest)
    token = base64.b64decode(crc).hex()  # parts of another version of the file get other names
    slices = _slices(size, slice_size, MAX_COMPOSE_SOURCES)
    names = [f"{dest.name}{PART_MARK}{token}-{i:02d}-of-{len(slices):02d}" for i in range(len(slices))]
    progress = _Progress(on_position)
    sent = [0, 0]

    def send(index: int) -> None:
        start, end = slices[index]
        with open(local, "rb") as f:
            f.seek(start)
            data = f.read(end - start)
        part_crc = checksums.crc32c_bytes(data)
        existing = target_bucket.get_blob(names[index], retry=retry())
        if existing is None or existing.crc32c != part_crc:
            blob = target_bucket.blob(names[index])
            blob.crc32c = part_crc  # the server refuses the part if its bytes do not match
            blob.upload_from_string(data, content_type="application/octet-stream", checksum=None, retry=None)
            with progress.lock:
                sent[0] += len(data)
                sent[1] += 1
        progress.add(len(data))

    try:
        with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="part") as pool:
            list(pool.map(send, range(len(slices))))
        target = target_bucket.blob(dest.name)
        target.content_type = "application/octet-stream"
        target.compose([target_bucket.blob(name) for name in names], retry=retry())
        target.reload(retry=retry())
    except Exception as exc:
        raise explain_error(exc, dest, "upload to it in parallel parts") from None
    if target.crc32c != crc:
        raise ChecksumMismatchError(f"{dest.url}: the composed object has crc32c {target.crc32c}, the file has "
                                    f"{crc}: the upload was corrupted.")
    for name in names:  # best-effort: a part left behind is reused or cleaned by the next upload
        try:
            target_bucket.blob(name).delete(retry=retry())
        except Exception:
            pass
    return sent[0], sent[1]


def ranged_download(src, local: str, size: int, crc: str | None, generation: int | None, workers: int,
                    slice_size: int, on_position: Callable[[int], None] | None = None) -> int:
    """Download one object as parallel byte ranges into ``local`` (atomically, CRC32C checked)."""
    blob = bucket(src).blob(src.name, generation=generation)
    progress = _Progress(on_position)
    try:
        with atomic_open(local, expected_size=size) as f:
            f.truncate(size)
            fd = f.fileno()

            def fetch(piece: tuple[int, int]) -> None:
                start, end = piece
                data = blob.download_as_bytes(start=start, end=end - 1, raw_download=True, checksum=None, retry=None)
                if len(data) != end - start:
                    raise ChecksumMismatchError(f"{src.url}: bytes {start}-{end - 1} came back short "
                                                f"({len(data)} bytes): the object changed during the download.")
                os.pwrite(fd, data, start)
                progress.add(len(data))

            try:
                with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="range") as pool:
                    list(pool.map(fetch, _slices(size, slice_size)))
            except ChecksumMismatchError:
                raise
            except Exception as exc:
                raise explain_error(exc, src, "download it in parallel ranges") from None
            f.flush()
            got = checksums.crc32c_file(f.name)
            if crc and got != crc:
                raise ChecksumMismatchError(
                    f"{src.url}: downloaded bytes have crc32c {got} but the object's is {crc}: corrupted in "
                    "transit or in storage; nothing was written under the final name.")
    except OSError as exc:
        raise explain(exc, local, "write the download") from None
    return progress.position
