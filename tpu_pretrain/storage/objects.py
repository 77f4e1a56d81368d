"""One file up or down, verified: single and resumable uploads, checksummed downloads.

Objects only appear under their final name when an upload completes, so writes are atomic by
nature; what this module adds is checking: every upload declares the file's crc32c (the server
refuses bytes that do not match) and the returned object's crc32c is compared again, and every
download is checksummed while it is written and only renamed into place when it matches.
Large files go up in resumable chunks; the session is remembered (in a 0600 file in the user's
cache folder: a session URL lets anyone finish that upload) so a re-run after a dropped
connection, or a process restart, continues where the server stopped instead of starting over.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path

from ..environment import environment_override
from . import auth, checksums
from .errors import ChecksumMismatchError, SessionExpiredError, explain
from .gcs import CHUNK_ALIGN, GcsPath, bucket, check_uploaded, content_type, explain_error
from .local import atomic_open


def upload_file(
    local: str,
    dest: GcsPath,
    crc: str,
    size: int,
    chunk_size: int = 8 * 1024 * 1024,
    resumable_threshold: int = 8 * 1024 * 1024,
    state_dir: str | os.PathLike | None = None,
    on_position: Callable[[int], None] | None = None,
) -> tuple[int, int]:
    """Upload a file whose crc32c is ``crc``; return (bytes sent over the wire, chunks sent)."""
    blob = bucket(dest).blob(dest.name)
    blob.crc32c = crc
    if size < resumable_threshold:
        try:
            blob.upload_from_filename(local, content_type=content_type(dest.name), checksum=None, retry=None)
        except Exception as exc:
            raise explain_error(exc, dest, "upload to it") from None
        check_uploaded(blob, crc, dest)
        if on_position:
            on_position(size)
        return size, 1
    return ResumableUpload(local, dest, blob, crc, size, chunk_size, state_dir, on_position).run()


def state_folder(state_dir: str | os.PathLike | None = None) -> Path:
    if state_dir:
        return Path(state_dir)
    if environment_override("TPU_PRETRAIN_CACHE_DIR"):
        return Path(environment_override("TPU_PRETRAIN_CACHE_DIR")) / "uploads"
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tpu_pretrain" / "uploads"


class ResumableUpload:
    """One resumable upload whose session survives failures and process restarts."""

    def __init__(self, local, dest: GcsPath, blob, crc, size, chunk_size, state_dir, on_position):
        self.local, self.dest, self.blob, self.crc, self.size = local, dest, blob, crc, size
        self.chunk_size = max(CHUNK_ALIGN, chunk_size // CHUNK_ALIGN * CHUNK_ALIGN)
        self.on_position = on_position or (lambda pos: None)
        folder = state_folder(state_dir)
        key = hashlib.sha256(f"{dest.url}\0{os.path.abspath(local)}".encode()).hexdigest()[:32]
        self.state_path = folder / f"{key}.json"
        self.identity = {"object": dest.url, "size": size, "crc32c": crc,
                         "endpoint": auth.emulator_host() or "gcs"}

    def run(self) -> tuple[int, int]:
        session = auth.http_session()
        url, offset = self._resume(session)
        sent = chunks = 0
        try:
            with open(self.local, "rb") as f:
                while True:
                    self.on_position(offset)
                    f.seek(offset)
                    data = f.read(min(self.chunk_size, self.size - offset))
                    last = offset + len(data) - 1
                    content_range = f"bytes {offset}-{last}/{self.size}" if data else f"bytes */{self.size}"
                    response = session.put(url, data=data, headers={"Content-Range": content_range},
                                           timeout=(15, 300))
                    sent += len(data)
                    chunks += 1
                    if response.status_code in (200, 201):
                        break
                    if response.status_code == 308:
                        offset = _next_offset(response)
                        continue
                    if response.status_code in (404, 410):
                        raise SessionExpiredError(f"{self.dest.url}: the upload session expired; "
                                                  "starting the upload again.")
                    raise _http_error(response)
        except SessionExpiredError:
            self._forget()
            raise
        except Exception as exc:
            raise explain_error(exc, self.dest, "upload to it") from None
        self._forget()
        self._finish(response.json())
        self.on_position(self.size)
        return sent, chunks

    def _resume(self, session) -> tuple[str, int]:
        """The session URL and the offset to continue from (0 with a fresh session)."""
        state = self._load()
        if state:
            response = session.put(state["url"], headers={"Content-Range": f"bytes */{self.size}"},
                                   timeout=(15, 60))
            if response.status_code == 308:
                return state["url"], _next_offset(response)
            if response.status_code in (200, 201):  # finished before the last run could record it
                return state["url"], self.size
            self._forget()  # expired (a week on Cloud Storage) or unknown: start again
        try:
            url = self.blob.create_resumable_upload_session(
                content_type=content_type(self.dest.name), size=self.size, checksum=None)
        except Exception as exc:
            raise explain_error(exc, self.dest, "start an upload to it") from None
        self._save(url)
        return url, 0

    def _load(self) -> dict | None:
        try:
            state = json.loads(self.state_path.read_text())
        except (OSError, ValueError):
            return None
        if {k: state.get(k) for k in self.identity} != self.identity:
            return None  # the file changed since: its old session would produce the wrong object
        return state

    def _save(self, url: str) -> None:
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(self.state_path.parent, 0o700)
        tmp = self.state_path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({**self.identity, "url": url}, f)
        os.replace(tmp, self.state_path)

    def _forget(self) -> None:
        self.state_path.unlink(missing_ok=True)

    def _finish(self, resource: dict) -> None:
        stored = resource.get("crc32c")
        if stored != self.crc or int(resource.get("size", -1)) != self.size:
            raise ChecksumMismatchError(
                f"{self.dest.url}: the stored object (crc32c {stored}, {resource.get('size')} bytes) does "
                f"not match the file (crc32c {self.crc}, {self.size} bytes).")


def _next_offset(response) -> int:
    """Where to continue after a 308: one past the last byte the server reports having."""
    match = re.match(r"bytes=0-(\d+)", response.headers.get("Range", ""))
    return int(match.group(1)) + 1 if match else 0


def _http_error(response):
    from google.api_core import exceptions as api

    return api.from_http_response(response)


def download_file(
    src: GcsPath,
    local: str,
    size: int,
    crc: str | None,
    generation: int | None = None,
    on_position: Callable[[int], None] | None = None,
) -> int:
    """Download one object to ``local`` atomically, verifying its crc32c; return bytes received."""
    position = 0

    def advance(n: int) -> None:
        nonlocal position
        position += n
        if on_position:
            on_position(position)

    blob = bucket(src).blob(src.name, generation=generation)
    try:
        with atomic_open(local, expected_size=size) as f:
            writer = checksums.ChecksummingWriter(f, on_bytes=advance)
            try:
                blob.download_to_file(writer, raw_download=True, checksum=None, retry=None)
            except Exception as exc:
                raise explain_error(exc, src, "download it") from None
            got = writer.crc32c()
            if crc and got != crc:
                raise ChecksumMismatchError(
                    f"{src.url}: downloaded bytes have crc32c {got} but the object's is {crc} "
                    f"({writer.bytes_written} of {size} bytes): corrupted in transit or in storage; "
                    "nothing was written under the final name.")
    except OSError as exc:
        raise explain(exc, local, "write the download") from None
    return position
