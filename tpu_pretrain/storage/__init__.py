"""One small interface over local folders, Google Drive (a mounted folder) and ``gs://bucket/prefix``.

Every part of tpu_pretrain reads and writes through these functions, so a run folder can live on
any of the three. Writes are atomic everywhere (a reader never sees half a file or object), and
transfers are verified by crc32c. Nothing here ever makes a bucket or object public.

    from tpu_pretrain import storage
    storage.write_text("gs://my-bucket/run1/config.json", text)
    storage.sync("run1/checkpoints", "gs://my-bucket/run1/checkpoints")

- ``local``: local folders (and Drive, mounted as one): atomic writes, listings.
- ``drive``: Google Drive on Colab: mounting on request, free space, deletions that free the quota.
- ``drive_api``: the Drive API's ``files.get`` and ``files.delete`` (permanent), with the user's sign-in.
- ``gcs``: Cloud Storage URLs, the shared client and its retries, folder-like operations on objects.
- ``objects``: one file up or down, verified: single and resumable uploads, checksummed downloads.
- ``sliced``: one large file moved as parallel slices: composite uploads, ranged downloads.
- ``transfer``: parallel, retried, verified copies of files and folders; what is already identical is skipped.
- ``download``: corpus URLs (``https://``, ``gs://``) fetched once into the local cache, resumed, checksummed.
- ``auth``: credentials for Cloud Storage that fit each place (emulator, key file, Colab, defaults), no secret shown.
- ``security``: ``storage-check``: public access found, what the credentials can do probed, least-privilege commands.
- ``checksums``: CRC32C in Cloud Storage's format, for files and streams.
- ``errors``: storage errors a user can act on, each naming the object, the cause and the fix.
"""

from __future__ import annotations

import dataclasses
import os

from . import drive
from .errors import (
    ChecksumMismatchError,
    InsufficientSpaceError,
    NotFoundError,
    PermissionDeniedError,
    StorageError,
)
from .gcs import GcsBackend, GcsPath, check_location, is_gcs_url
from .local import LocalBackend, atomic_open
from .transfer import FileResult, TransferOptions, TransferSummary, transfer

__all__ = [
    "ChecksumMismatchError", "FileResult", "GcsPath", "InsufficientSpaceError", "NotFoundError",
    "PermissionDeniedError", "StorageError", "TransferOptions", "TransferSummary", "atomic_open",
    "check_location", "copy", "delete", "ensure_free_space", "exists", "free_space", "is_dir", "is_gcs_url", "join",
    "list_files", "read_bytes", "read_text", "sync", "transfer", "write_bytes", "write_text",
]

ensure_free_space = drive.ensure_free_space
_LOCAL = LocalBackend()
_GCS = GcsBackend()


def _backend(path: str | os.PathLike):
    path = os.fspath(path)
    check_location(path)
    if is_gcs_url(path):
        return _GCS, path
    drive.ensure_drive_ready(path)
    return _LOCAL, path


def join(base: str | os.PathLike, *parts: str) -> str:
    """Join path parts with '/' for gs:// URLs and the OS separator for local paths."""
    base = os.fspath(base)
    if is_gcs_url(base):
        return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])
    return os.path.join(base, *parts)


def exists(path: str | os.PathLike) -> bool:
    """Whether a file/object exists, or a folder/prefix holds anything."""
    backend, p = _backend(path)
    return backend.exists(p)


def is_dir(path: str | os.PathLike) -> bool:
    backend, p = _backend(path)
    return backend.is_dir(p)


def list_files(path: str | os.PathLike) -> list[tuple[str, int]]:
    """``(relative path, size)`` of every file under a folder or prefix, sorted."""
    backend, p = _backend(path)
    if backend is _GCS:
        return [(info.rel, info.size) for info in backend.list(p)]
    return backend.list(p)


def read_bytes(path: str | os.PathLike) -> bytes:
    backend, p = _backend(path)
    return backend.read_bytes(p)


def read_text(path: str | os.PathLike, encoding: str = "utf-8") -> str:
    return read_bytes(path).decode(encoding)


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write atomically: readers see the old content or the new, never a mix."""
    backend, p = _backend(path)
    backend.write_bytes(p, data)


def write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> None:
    write_bytes(path, text.encode(encoding))


def copy(src: str | os.PathLike, dst: str | os.PathLike, options: TransferOptions | None = None,
         **fields) -> TransferSummary:
    """Copy one file or object (any pair of local and gs://), verified; raise if it fails."""
    return sync(src, dst, options, **fields)


def sync(src: str | os.PathLike, dst: str | os.PathLike, options: TransferOptions | None = None,
         **fields) -> TransferSummary:
    """Make ``dst`` hold what ``src`` holds (files already identical are skipped); raise on failure.

    ``options`` (the configured transfer settings) and keyword :class:`TransferOptions` fields say how;
    ``progress`` defaults to False here.
    """
    for side in (src, dst):
        _backend(side)  # validates the URL / Drive mount
    options = dataclasses.replace(options, **fields) if options else TransferOptions(**{"progress": False, **fields})
    return transfer(os.fspath(src), os.fspath(dst), options).raise_for_failures()


def delete(path: str | os.PathLike, recursive: bool = False) -> None:
    """Delete a file/object, or with ``recursive`` a folder/prefix and everything under it."""
    backend, p = _backend(path)
    backend.delete(p, recursive=recursive)


def free_space(path: str | os.PathLike) -> int | None:
    """Free bytes where ``path`` would be written; None for buckets (no fixed capacity)."""
    backend, p = _backend(path)
    return backend.free_space(p)
