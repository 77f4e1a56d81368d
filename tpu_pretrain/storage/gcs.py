"""Cloud Storage (``gs://bucket/prefix``) through google-cloud-storage, with verified transfers.

URLs, the shared client and its bounded retries, errors that say which object and why, and the
folder-like operations (exists, list, read, write, delete, copy) on objects and prefixes. Moving one
file up or down, verified, is :mod:`.objects`; in parallel slices, :mod:`.sliced`.
"""

from __future__ import annotations

import mimetypes
import os
import re
from dataclasses import dataclass

from ..environment import environment_override
from . import auth, checksums
from .errors import ChecksumMismatchError, NotFoundError, StorageError, explain

_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
CHUNK_ALIGN = 256 * 1024  # resumable chunks must be multiples of 256 KiB (except the last)
# Parts of a parallel (composite) upload carry this in their names; listings hide them while in flight.
PART_MARK = ".tpu-pretrain-part-"


def is_gcs_url(url: str | os.PathLike) -> bool:
    return isinstance(url, str) and url.startswith("gs://")


_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):")  # two letters or more: C:\ stays a Windows path


def check_location(path: str | os.PathLike) -> None:
    """Refuse a URL of another kind (s3://, http://) or a mistyped gs:// URL, which would become a local folder."""
    text = os.fspath(path)
    match = _SCHEME_RE.match(text)
    if is_gcs_url(text) or match is None:
        return
    scheme = match.group(1)
    hint = f" Did you mean gs://{text[match.end():].lstrip('/')}?" if scheme.lower() == "gs" else ""
    raise StorageError(
        f"{text}: '{scheme}:' is not a supported location. Use a local path, a mounted Drive folder "
        f"(/content/drive/MyDrive/...) or a Cloud Storage URL gs://BUCKET/PATH (a local name with a colon: "
        f"./{text}).{hint}")


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


def client():
    return auth.storage_client()


def retry():
    """The client library's retry for metadata calls, bounded (it defaults to 120 s per call).

    Transfers have their own retries with backoff on top, so a shorter bound here keeps a vanished
    server from stalling a caller for minutes. ``TPU_PRETRAIN_GCS_RETRY_SECONDS`` sets it (default 30).
    """
    from google.cloud.storage.retry import DEFAULT_RETRY

    return DEFAULT_RETRY.with_timeout(float(environment_override("TPU_PRETRAIN_GCS_RETRY_SECONDS", "30")))


def bucket(path: GcsPath):
    return client().bucket(path.bucket)


def bucket_exists(bucket: str) -> bool:
    """Whether the bucket exists, using only objects.list (which least-privilege accounts have)."""
    from google.api_core import exceptions as api

    try:
        list(client().list_blobs(bucket, max_results=1, retry=retry()))
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
            if named and bucket(path).get_blob(path.name, retry=retry()) is not None:
                return True
            prefix = path.name.rstrip("/") + "/" if path.name else ""
            blobs = client().list_blobs(path.bucket, prefix=prefix, max_results=1, retry=retry())
            return any(True for _ in blobs)
        except Exception as exc:
            raise explain_error(exc, path, "check whether it exists") from None

    def is_dir(self, url: str) -> bool:
        path = GcsPath.parse(url)
        if path.name and not path.name.endswith("/"):
            try:
                if bucket(path).get_blob(path.name, retry=retry()) is not None:
                    return False
            except Exception as exc:
                raise explain_error(exc, path, "look it up") from None
        return True

    def list(self, url: str) -> list[ObjectInfo]:
        """Objects under ``url`` (as a prefix), or the one object it names, with sizes and crc32c."""
        path = GcsPath.parse(url)
        try:
            if path.name and not path.name.endswith("/"):
                blob = bucket(path).get_blob(path.name, retry=retry())
                if blob is not None:
                    return [_info(blob, path.name.rsplit("/", 1)[-1])]
            prefix = path.name.rstrip("/") + "/" if path.name else ""
            found = [
                _info(blob, blob.name[len(prefix):])
                for blob in client().list_blobs(path.bucket, prefix=prefix, retry=retry())
                if not blob.name.endswith("/")  # folder placeholders made by the web console
                and PART_MARK not in blob.name  # parts of a parallel upload still in flight
            ]
        except Exception as exc:
            raise explain_error(exc, path, "list it") from None
        return sorted(found, key=lambda info: info.rel)

    def read_bytes(self, url: str) -> bytes:
        path = GcsPath.parse(url)
        try:
            blob = bucket(path).get_blob(path.name, retry=retry())
            if blob is None:
                raise _not_found(path, "read it")
            data = blob.download_as_bytes(raw_download=True, checksum=None)
        except StorageError:
            raise
        except Exception as exc:
            raise explain_error(exc, path, "read it") from None
        got = checksums.crc32c_bytes(data)
        if blob.crc32c and got != blob.crc32c:
            raise ChecksumMismatchError(f"{path.url}: downloaded bytes have crc32c {got}, the object "
                                        f"says {blob.crc32c}: corrupted in transit or in storage.")
        return data

    def write_bytes(self, url: str, data: bytes) -> None:
        path = GcsPath.parse(url)
        crc = checksums.crc32c_bytes(data)
        blob = bucket(path).blob(path.name)
        blob.crc32c = crc  # the server refuses the upload if the bytes do not match
        try:
            blob.upload_from_string(data, content_type=content_type(path.name), checksum=None)
        except Exception as exc:
            raise explain_error(exc, path, "write it") from None
        check_uploaded(blob, crc, path)

    def delete(self, url: str, recursive: bool = False) -> None:
        path = GcsPath.parse(url)
        try:
            if path.name and not path.name.endswith("/"):
                blob = bucket(path).get_blob(path.name, retry=retry())
                if blob is not None:
                    blob.delete(retry=retry())
                    return
            if not recursive:
                raise _not_found(path, "delete it")
            prefix = path.name.rstrip("/") + "/" if path.name else ""
            blobs = list(client().list_blobs(path.bucket, prefix=prefix, retry=retry()))
            if not blobs:
                raise _not_found(path, "delete it")
            for blob in blobs:
                blob.delete(retry=retry())
        except StorageError:
            raise
        except Exception as exc:
            raise explain_error(exc, path, "delete it") from None

    def free_space(self, url: str) -> None:
        return None  # a bucket has no fixed capacity

    def copy_object(self, src: str, dst: str, generation: int | None = None) -> str:
        """Server-side copy (rewrite, so any size works); returns the new object's crc32c."""
        s, d = GcsPath.parse(src), GcsPath.parse(dst)
        source = bucket(s).blob(s.name, generation=generation)
        target = bucket(d).blob(d.name)
        try:
            token, _, _ = target.rewrite(source)
            while token is not None:
                token, _, _ = target.rewrite(source, token=token)
        except Exception as exc:
            raise explain_error(exc, d, f"copy {s.url} to it") from None
        return target.crc32c


def _info(blob, rel: str) -> ObjectInfo:
    return ObjectInfo(rel, int(blob.size or 0), blob.crc32c, blob.generation)


def content_type(name: str) -> str:
    return mimetypes.guess_type(name)[0] or "application/octet-stream"


def explain_error(exc: BaseException, path: GcsPath, action: str) -> StorageError:
    """A :class:`StorageError` for a failed call on ``path``; a 404 says whether the bucket itself is missing."""
    from google.api_core import exceptions as api

    if isinstance(exc, api.NotFound):
        try:
            return _not_found(path, action)
        except Exception:  # the probe itself failed: report the original error
            pass
    return explain(exc, path.url, action)


def check_uploaded(blob, crc: str, path: GcsPath) -> None:
    if blob.crc32c != crc:
        raise ChecksumMismatchError(f"{path.url}: the stored object has crc32c {blob.crc32c}, the file "
                                    f"has {crc}: the upload was corrupted.")
