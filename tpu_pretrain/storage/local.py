"""Local folders (and Google Drive, which Colab mounts as a folder): atomic writes, listings.

Every write goes to a temporary name in the destination folder and is renamed into place, so a
reader (or a resumed run) never sees half a file, even if the process dies mid-write.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from . import drive
from .errors import InsufficientSpaceError, NotFoundError, StorageError

TEMP_MARK = ".tpu-pretrain-tmp-"
# Writes at least this large are preceded by a free-space check (checkpoints, shards).
LARGE_WRITE = 16 * 1024 * 1024


def temp_name(path: str | os.PathLike) -> Path:
    path = Path(path)
    return path.with_name(f".{path.name}{TEMP_MARK}{uuid.uuid4().hex[:12]}")


def new_temp_folder(path: str | os.PathLike) -> Path:
    """An empty folder beside ``path`` to build its replacement in, named with :data:`TEMP_MARK`, this host and
    process. Those a killed process of this host left are removed first: the mark says this tool made them."""
    path = Path(path)
    prefix, host = f".{path.name}{TEMP_MARK}", socket.gethostname()
    for stale in path.parent.glob(f"{prefix}*"):
        owner = stale.name[len(prefix):].rsplit("-", 2)
        if stale.is_dir() and len(owner) == 3 and owner[0] == host and owner[1].isdigit() \
                and not _process_alive(int(owner[1])):
            shutil.rmtree(stale, ignore_errors=True)
    folder = path.with_name(f"{prefix}{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    folder.mkdir(parents=True)
    return folder


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_temp_name(name: str) -> bool:
    return TEMP_MARK in name


@contextmanager
def atomic_open(path: str | os.PathLike, expected_size: int | None = None) -> Iterator:
    """Open a temporary file next to ``path`` for writing; rename it to ``path`` on success only."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if expected_size is not None and expected_size >= LARGE_WRITE:
        drive.ensure_free_space(path.parent, expected_size, what=path.name)
    tmp = temp_name(path)
    try:
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> None:
    """Write a small text file (a manifest, a config, a pointer) so that readers see the old or the new one."""
    with atomic_open(path) as f:
        f.write(text.encode(encoding))


@contextmanager
def disk_full_said(path: str | os.PathLike) -> Iterator[None]:
    """A full disk (ENOSPC, EDQUOT) met in the block as one line naming ``path`` and the fix: a disk is found full
    only by writing, after the checks that run before the slow work."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise InsufficientSpaceError(f"The disk under {Path(path).parent} is full ({exc.strerror}): {path} was not "
                                     "written. Free space and run the same command again.") from None


def check_writable_folder(path: str | os.PathLike, setting: str = "output_dir") -> Path:
    """``path`` as a folder this step can write to (created later), or an error before any slow work starts:
    it is a file, it lies under a file, or the place is read-only."""
    if "://" in str(path):
        raise StorageError(f"{setting} {path}: this step writes to a local (or mounted Drive) folder; write there, "
                           "then `tpu-pretrain upload` it.")
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise StorageError(f"{setting} {folder} is a file, not a folder: choose a folder (it is created if missing).")
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise StorageError(f"{setting} {folder} cannot be created: {existing} is a file.")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        raise StorageError(f"{setting} {folder} is not writable ({exc.strerror or exc} in {existing}): choose a "
                           "folder you can write to.") from None
    return folder


class LocalBackend:
    """Files under a local path; paths are plain filesystem paths."""

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(path)

    def list(self, path: str) -> list[tuple[str, int]]:
        """(relative path with '/' separators, size) of every file under ``path`` (or of the file)."""
        if os.path.isfile(path):
            return [(os.path.basename(path), os.path.getsize(path))]
        if not os.path.isdir(path):
            raise NotFoundError(f"{path}: no such file or folder.")
        found = []
        for root, dirs, files in os.walk(path):
            dirs.sort()
            for name in sorted(files):
                if is_temp_name(name):
                    continue  # another writer's unfinished file
                full = os.path.join(root, name)
                found.append((os.path.relpath(full, path).replace(os.sep, "/"), os.path.getsize(full)))
        return found

    def read_bytes(self, path: str) -> bytes:
        try:
            return Path(path).read_bytes()
        except FileNotFoundError:
            raise NotFoundError(f"{path}: no such file.") from None

    def write_bytes(self, path: str, data: bytes) -> None:
        with atomic_open(path, expected_size=len(data)) as f:
            f.write(data)

    def copy_file(self, src: str, dst: str, on_bytes: Callable[[int], None] | None = None) -> None:
        with open(src, "rb") as fin, atomic_open(dst, expected_size=os.path.getsize(src)) as fout:
            while block := fin.read(4 * 1024 * 1024):
                fout.write(block)
                if on_bytes:
                    on_bytes(len(block))

    def delete(self, path: str, recursive: bool = False) -> None:
        if os.path.isdir(path) and not os.path.islink(path):
            if not recursive:
                raise StorageError(f"{path} is a folder; pass recursive=True to delete it and its files.")
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.unlink(path)
        else:
            raise NotFoundError(f"{path}: no such file or folder.")

    def free_space(self, path: str) -> int | None:
        return drive.free_space(path)
