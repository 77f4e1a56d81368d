"""crc32c in Cloud Storage's format (base64 of the big-endian 4 bytes), for files and streams.

Cloud Storage stores a crc32c for every object, composite objects included (an MD5 is missing for
those), so crc32c is the one checksum that can compare any local file with any object.
"""

from __future__ import annotations

import base64
import os

import google_crc32c

BLOCK = 4 * 1024 * 1024


def encode(checksum: google_crc32c.Checksum) -> str:
    return base64.b64encode(checksum.digest()).decode("ascii")


def crc32c_bytes(data: bytes) -> str:
    return encode(google_crc32c.Checksum(data))


def crc32c_file(path: str | os.PathLike, on_bytes=None) -> str:
    """crc32c of a whole file, read in blocks (``on_bytes(n)`` is told how far it got)."""
    checksum = google_crc32c.Checksum()
    with open(path, "rb") as f:
        while block := f.read(BLOCK):
            checksum.update(block)
            if on_bytes:
                on_bytes(len(block))
    return encode(checksum)


class ChecksummingWriter:
    """A file-like writer that computes the crc32c of everything written through it."""

    def __init__(self, f, on_bytes=None):
        self._f = f
        self._checksum = google_crc32c.Checksum()
        self._on_bytes = on_bytes
        self.bytes_written = 0

    def write(self, data: bytes) -> int:
        self._checksum.update(data)
        self._f.write(data)
        self.bytes_written += len(data)
        if self._on_bytes:
            self._on_bytes(len(data))
        return len(data)

    def flush(self) -> None:
        self._f.flush()

    def crc32c(self) -> str:
        return encode(self._checksum)
