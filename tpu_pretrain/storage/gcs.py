"""Cloud Storage (``gs://bucket/prefix``) through google-cloud-storage, with verified transfers.

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
import mimetypes
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import auth, checksums
from .errors import ChecksumMismatchError, NotFoundError, SessionExpiredError, StorageError, explain
from .local import atomic_open
from .sliced import PART_MARK

_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
CHUNK_ALIGN = 256 * 1024  # resumable chunks must be multiples of 256 KiB (except the last)


def is_gcs_url(url: str | os.PathLike) -> bool:
    return isinstance(url, str) and url.startswith("gs://")


@dataclass(frozen=True)
class GcsPath:
    bucket: str
    name: str  # object name or prefix, without a leading '/'

    @classmethod
    def parse(cls, url: str) -> GcsPath:
        if not is_gcs_url(url):
            raise StorageError(f"{url!r} is not a gs://bucket/path URL.")
        bucket, _, name = url[5:].partition("/")
        if not _BUCKET_RE.match(bucket):
            raise StorageError(
                f"{url}: {bucket!r} is not a valid bucket name (3-63 lower-case letters, digits, '-', '_' "
                "or '.', starting and ending with a letter or digit)."
            )
        return cls(bucket, name)

    @property
    def url(self) -> str:
        return f"gs://{self.bucket}/{self.name}"

    def child(self, rel: str) -> GcsPath:
        base = self.name.rstrip("/")
        return GcsPath(self.bucket, f"{base}/{rel}" if base else rel)


@dataclass(frozen=True)
class ObjectInfo:
    rel: str
    size: int
    crc32c: str | None
    generation: int | None


def _client():
    return auth.storage_client()


def _retry():
    """The client library's retry for metadata calls, bounded (it defaults to 120 s per call).

    Transfers have their own retries with backoff on top, so a shorter bound here keeps a vanished
    server from stalling a caller for minutes. ``TPU_PRETRAIN_GCS_RETRY_SECONDS`` sets it (default 30).
    """
    from google.cloud.storage.retry import DEFAULT_RETRY

    return DEFAULT_RETRY.with_timeout(float(os.environ.get("TPU_PRETRAIN_GCS_RETRY_SECONDS", "30")))


def _bucket(path: GcsPath):
    return _client().bucket(path.bucket)


def bucket_exists(bucket: str) -> bool:
    """Whether the bucket exists, using only objects.list (which least-privilege accounts have)."""
    from google.api_core import exceptions as api

    try:
        list(_client().list_blobs(bucket, max_results=1, retry=_retry()))
        return True
    except api.NotFound:
        return False


def missing_bucket_error(path: GcsPath) -> NotFoundError:
    return NotFoundError(
        f"{path.url}: bucket gs://{path.bucket} does not exist (or is in a project these credentials "
        f"cannot see). Check the name, or create it: `gcloud storage buckets create gs://{path.bucket} "
        "--location=REGION --uniform-bucket-level-access --public-access-prevention` (use the TPU's region)."
    )


def _not_found(path: GcsPath, action: str) -> NotFoundError:
    if not bucket_exists(path.bucket):
        return missing_bucket_error(path)
    return NotFoundError(f"{path.url}: no such object (while trying to {action}).")


class GcsBackend:
    """Operations on ``gs://`` URLs."""

    def exists(self, url: str) -> bool:
        path = GcsPath.parse(url)
        try:
            named = path.name and not path.name.endswith("/")
            if named and _bucket(path).get_blob(path.name, retry=_retry()) is not None:
                return True
            prefix = path.name.rstrip("/") + "/" if path.name else ""
            blobs = _client().list_blobs(path.bucket, prefix=prefix, max_results=1, retry=_retry())
            return any(True for _ in blobs)
        except Exception as exc:
            raise _explain(exc, path, "check whether it exists") from None

    def is_dir(self, url: str) -> bool:
        path = GcsPath.parse(url)
        if path.name and not path.name.endswith("/"):
            try:
                if _bucket(path).get_blob(path.name, retry=_retry()) is not None:
                    return False
            except Exception as exc:
                raise _explain(exc, path, "look it up") from None
        return True

    def list(self, url: str) -> list[ObjectInfo]:
        """Objects under ``url`` (as a prefix), or the one object it names, with sizes and crc32c."""
        path = GcsPath.parse(url)
        try:
            if path.name and not path.name.endswith("/"):
                blob = _bucket(path).get_blob(path.name, retry=_retry())
                if blob is not None:
                    return [_info(blob, path.name.rsplit("/", 1)[-1])]
            prefix = path.name.rstrip("/") + "/" if path.name else ""
            found = [
                _info(blob, blob.name[len(prefix):])
                for blob in _client().list_blobs(path.bucket, prefix=prefix, retry=_retry())
                if not blob.name.endswith("/")  # folder placeholders made by the web console
                and PART_MARK not in blob.name  # parts of a parallel upload still in flight
            ]
        except Exception as exc:
            raise _explain(exc, path, "list it") from None
        return sorted(found, key=lambda info: info.rel)

    def read_bytes(self, url: str) -> bytes:
        path = GcsPath.parse(url)
        try:
            blob = _bucket(path).get_blob(path.name, retry=_retry())
            if blob is None:
                raise _not_found(path, "read it")
            data = blob.download_as_bytes(raw_download=True, checksum=None)
        except StorageError:
            raise
        except Exception as exc:
            raise _explain(exc, path, "read it") from None
        got = checksums.crc32c_bytes(data)
        if blob.crc32c and got != blob.crc32c:
            raise ChecksumMismatchError(f"{path.url}: downloaded bytes have crc32c {got}, the object "
                                        f"says {blob.crc32c}: corrupted in transit or in storage.")
        return data

    def write_bytes(self, url: str, data: bytes) -> None:
        path = GcsPath.parse(url)
        crc = checksums.crc32c_bytes(data)
        blob = _bucket(path).blob(path.name)
        blob.crc32c = crc  # the server refuses the upload if the bytes do not match
        try:
            blob.upload_from_string(data, content_type=_content_type(path.name), checksum=None)
        except Exception as exc:
            raise _explain(exc, path, "write it") from None
        _check_uploaded(blob, crc, path)

    def delete(self, url: str, recursive: bool = False) -> None:
        path = GcsPath.parse(url)
        try:
            if path.name and not path.name.endswith("/"):
                blob = _bucket(path).get_blob(path.name, retry=_retry())
                if blob is not None:
                    blob.delete(retry=_retry())
                    return
            if not recursive:
                raise _not_found(path, "delete it")
            prefix = path.name.rstrip("/") + "/" if path.name else ""
            blobs = list(_client().list_blobs(path.bucket, prefix=prefix, retry=_retry()))
            if not blobs:
                raise _not_found(path, "delete it")
            for blob in blobs:
                blob.delete(retry=_retry())
        except StorageError:
            raise
        except Exception as exc:
            raise _explain(exc, path, "delete it") from None

    def free_space(self, url: str) -> None:
        return None  # a bucket has no fixed capacity

    def copy_object(self, src: str, dst: str, generation: int | None = None) -> str:
        """Server-side copy (rewrite, so any size works); returns the new object's crc32c."""
        s, d = GcsPath.parse(src), GcsPath.parse(dst)
        source = _bucket(s).blob(s.name, generation=generation)
        target = _bucket(d).blob(d.name)
        try:
            token, _, _ = target.rewrite(source)
            while token is not None:
                token, _, _ = target.rewrite(source, token=token)
        except Exception as exc:
            raise _explain(exc, d, f"copy {s.url} to it") from None
        return target.crc32c


def _info(blob, rel: str) -> ObjectInfo:
    return ObjectInfo(rel, int(blob.size or 0), blob.crc32c, blob.generation)


def _content_type(name: str) -> str:
    return mimetypes.guess_type(name)[0] or "application/octet-stream"


def _explain(exc: BaseException, path: GcsPath, action: str) -> StorageError:
    from google.api_core import exceptions as api

    if isinstance(exc, api.NotFound):
        try:
            return _not_found(path, action)
        except Exception:  # the probe itself failed: report the original error
            pass
    return explain(exc, path.url, action)


def _check_uploaded(blob, crc: str, path: GcsPath) -> None:
    if blob.crc32c != crc:
        raise ChecksumMismatchError(f"{path.url}: the stored object has crc32c {blob.crc32c}, the file "
                                    f"has {crc}: the upload was corrupted.")


# -- transfers of single files -------------------------------------------------------------------
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
    blob = _bucket(dest).blob(dest.name)
    blob.crc32c = crc
    if size < resumable_threshold:
        try:
            blob.upload_from_filename(local, content_type=_content_type(dest.name), checksum=None, retry=None)
        except Exception as exc:
            raise _explain(exc, dest, "upload to it") from None
        _check_uploaded(blob, crc, dest)
        if on_position:
            on_position(size)
        return size, 1
    return ResumableUpload(local, dest, blob, crc, size, chunk_size, state_dir, on_position).run()


def state_folder(state_dir: str | os.PathLike | None = None) -> Path:
    if state_dir:
        return Path(state_dir)
    if os.environ.get("TPU_PRETRAIN_CACHE_DIR"):
        return Path(os.environ["TPU_PRETRAIN_CACHE_DIR"]) / "uploads"
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
            raise _explain(exc, self.dest, "upload to it") from None
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
                content_type=_content_type(self.dest.name), size=self.size, checksum=None)
        except Exception as exc:
            raise _explain(exc, self.dest, "start an upload to it") from None
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

    blob = _bucket(src).blob(src.name, generation=generation)
    try:
        with atomic_open(local, expected_size=size) as f:
            writer = checksums.ChecksummingWriter(f, on_bytes=advance)
            try:
                blob.download_to_file(writer, raw_download=True, checksum=None, retry=None)
            except Exception as exc:
                raise _explain(exc, src, "download it") from None
            got = writer.crc32c()
            if crc and got != crc:
                raise ChecksumMismatchError(
                    f"{src.url}: downloaded bytes have crc32c {got} but the object's is {crc} "
                    f"({writer.bytes_written} of {size} bytes): corrupted in transit or in storage; "
                    "nothing was written under the final name.")
    except OSError as exc:
        raise explain(exc, local, "write the download") from None
    return position
