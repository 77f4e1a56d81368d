"""Storage errors a user can act on: each message names the object, the cause and the fix.

Cloud Storage client exceptions carry URLs and raw response bodies; :func:`explain` turns them into
one sentence that says what happened to which object. Resumable-upload session URLs act as bearer
tokens for that upload, so :func:`redact` strips them from any text we show.
"""

from __future__ import annotations

import errno
import re

from ..errors import UserInputError


class StorageError(UserInputError):
    """A storage operation failed; the message names the object, the cause and what to do."""


class NotFoundError(StorageError):
    """A file, object or bucket does not exist."""


class PermissionDeniedError(StorageError):
    """The credentials in use lack a permission (HTTP 401/403)."""


class ChecksumMismatchError(StorageError):
    """The bytes that arrived do not match the source's crc32c."""


class SessionExpiredError(StorageError):
    """The server forgot a resumable upload session (they expire after a week); a retry starts anew."""

    transient = True


class InsufficientSpaceError(StorageError):
    """The destination does not have room for what is about to be written."""


_SECRET_PATTERNS = (
    (re.compile(r"(upload_id=)[^&\s'\"]+"), r"\1<redacted>"),
    (re.compile(r"(access_token=|Bearer\s+|private_key[\"']?\s*[:=]\s*[\"']?)[^&\s'\"]+", re.I),
     r"\1<redacted>"),
)


def redact(text: str) -> str:
    """Remove upload session ids and tokens from a message before it is shown or logged."""
    for pattern, replacement in _SECRET_PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def is_transient(exc: BaseException) -> bool:
    """Whether retrying later may succeed: network trouble, throttling, server errors, bad bytes."""
    import requests
    from google.api_core import exceptions as api
    from google.auth import exceptions as auth_exc

    if isinstance(exc, ChecksumMismatchError | SessionExpiredError):
        return True
    if isinstance(exc, StorageError):
        return getattr(exc, "transient", False)
    if isinstance(exc, requests.ConnectionError | requests.Timeout | requests.exceptions.ChunkedEncodingError
                  | ConnectionError | TimeoutError | auth_exc.TransportError):
        return True
    if isinstance(exc, api.TooManyRequests | api.InternalServerError | api.BadGateway
                  | api.ServiceUnavailable | api.GatewayTimeout):
        return True
    code = _status_code(exc)
    return code in (408, 429) or (code is not None and code >= 500)


# What a failed write says, by cause; the checks run in this order (a full disk can also deny permission).
_CAUSE_WORDS = {
    "quota": ("no space left", "not enough space", "quota", "disk full", "insufficient storage"),
    "permissions": ("permission denied", "read-only file system", "forbidden", "not writable", "access denied",
                    "operation not permitted"),
    "network": ("cannot reach", "connection", "timed out", "did not answer", "name or service not known",
                "network is unreachable", "temporarily unavailable", "cannot get an access token", "timeout"),
}
_CAUSE_ERRNOS = {"quota": (errno.ENOSPC, errno.EDQUOT), "permissions": (errno.EACCES, errno.EPERM, errno.EROFS),
                 "network": (errno.ECONNREFUSED, errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ETIMEDOUT)}


def failure_cause(exc: BaseException) -> str | None:
    """Why a write failed, as a user fixes it: ``quota`` (no room), ``permissions``, ``network``, or None."""
    if isinstance(exc, InsufficientSpaceError):
        return "quota"
    text = str(exc).lower()
    for cause, words in _CAUSE_WORDS.items():
        if getattr(exc, "errno", None) in _CAUSE_ERRNOS[cause] or any(word in text for word in words):
            return cause
    if isinstance(exc, PermissionDeniedError | PermissionError):
        return "permissions"
    if isinstance(exc, ConnectionError | TimeoutError):
        return "network"
    return None


def _status_code(exc: BaseException) -> int | None:
    code = getattr(exc, "code", None)
    if isinstance(code, int):
        return code
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None


def explain(exc: BaseException, what: str, action: str = "access") -> StorageError:
    """A :class:`StorageError` saying why ``action`` on ``what`` (a URL or path) failed."""
    import requests
    from google.api_core import exceptions as api

    if isinstance(exc, StorageError):
        return exc
    code = _status_code(exc)
    detail = redact(_server_message(exc))
    if isinstance(exc, api.Forbidden | api.Unauthorized) or code in (401, 403):
        err: StorageError = PermissionDeniedError(
            f"{what}: permission denied to {action} (HTTP {code}: {detail}). The credentials in use "
            "lack a Cloud Storage permission here; run `tpu-pretrain storage-check "
            f"{_bucket_url(what)}` to see what they can do and the gcloud commands that grant only "
            "what is needed."
        )
    elif isinstance(exc, api.NotFound) or code == 404:
        err = NotFoundError(f"{what}: not found (HTTP 404) while trying to {action}.")
    elif isinstance(exc, requests.ConnectionError | ConnectionError):
        err = StorageError(f"{what}: cannot reach the storage server to {action} "
                           f"({type(exc).__name__}: {_short(redact(str(exc)))}).")
    elif isinstance(exc, requests.Timeout | TimeoutError):
        err = StorageError(f"{what}: the storage server did not answer in time while trying to {action}.")
    elif isinstance(exc, OSError):
        err = StorageError(f"{what}: cannot {action}: {exc.strerror or exc}.")
    else:
        err = StorageError(f"{what}: cannot {action}: {type(exc).__name__}: {_short(detail)}")
    err.transient = is_transient(exc)
    return err


def _server_message(exc: BaseException) -> str:
    message = getattr(exc, "message", None)
    if isinstance(message, str) and message and message != "unknown error":
        return message.split(": ", 1)[-1] if message.startswith(("GET ", "POST ", "PUT ")) else message
    response = getattr(exc, "response", None)
    if response is not None:
        try:
            return str(response.json()["error"]["message"])
        except Exception:  # not JSON: fall back to the text
            text = getattr(response, "text", "")
            if text:
                return _short(text)
    return _short(str(exc)) or type(exc).__name__


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _bucket_url(what: str) -> str:
    if what.startswith("gs://"):
        return "gs://" + what[5:].split("/", 1)[0]
    return "gs://BUCKET"
