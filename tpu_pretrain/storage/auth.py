"""Credentials for Cloud Storage that fit each place, without ever showing a secret.

Order: an emulator (``STORAGE_EMULATOR_HOST``: anonymous, for tests and offline work); a key file
named by ``GOOGLE_APPLICATION_CREDENTIALS`` (Kaggle secrets, CI); Colab's user sign-in; application
default credentials (``gcloud auth application-default login``, a TPU VM's service account).
Only the kind of credential and a service account's e-mail are ever printed: tokens and keys are
not, and a Kaggle secret is written to a 0600 file in the user's config folder, never a run folder.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from pathlib import Path

from ..environment import environment_override
from ..runtime import in_colab
from .errors import StorageError

log = logging.getLogger(__name__)

SCOPES = ("https://www.googleapis.com/auth/devstorage.read_write",)
EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
KEY_ENV = "GOOGLE_APPLICATION_CREDENTIALS"

_lock = threading.Lock()
_cached: dict[str, object] = {}


def emulator_host() -> str | None:
    """The emulator's base URL when ``STORAGE_EMULATOR_HOST`` is set."""
    host = environment_override(EMULATOR_ENV)
    if not host:
        return None
    return host if "://" in host else f"http://{host}"


def get_credentials():
    """``(credentials, project or None)`` for this environment; raises a StorageError saying how."""
    if emulator_host():
        from google.auth.credentials import AnonymousCredentials

        return AnonymousCredentials(), environment_override("GOOGLE_CLOUD_PROJECT", "emulator")
    import google.auth
    from google.auth import exceptions as auth_exc

    key = environment_override(KEY_ENV)
    if key:
        _check_key_file(key)
        try:
            credentials, project = google.auth.load_credentials_from_file(key, scopes=SCOPES)
        except auth_exc.DefaultCredentialsError as exc:
            raise StorageError(
                f"{KEY_ENV} points at {key}, which is not a usable credentials file ({_kind_only(exc)}). "
                "Use a service-account JSON key, or unset the variable to use your own sign-in."
            ) from None
        return credentials, project or environment_override("GOOGLE_CLOUD_PROJECT")
    if in_colab():
        from google.colab import auth as colab_auth  # type: ignore[import-not-found]

        colab_auth.authenticate_user()  # idempotent; shows Colab's own sign-in prompt once
    try:
        credentials, project = google.auth.default(scopes=SCOPES)
    except auth_exc.DefaultCredentialsError:
        raise StorageError(
            "No Google Cloud credentials found. On Colab, run the sign-in cell "
            "(`from google.colab import auth; auth.authenticate_user()`); on Kaggle, store a "
            "service-account key as a secret and call "
            "`tpu_pretrain.storage.auth.use_kaggle_secret('NAME')`; elsewhere run "
            f"`gcloud auth application-default login` or set {KEY_ENV} to a service-account key file."
        ) from None
    return credentials, project or environment_override("GOOGLE_CLOUD_PROJECT")


def _check_key_file(path: str) -> None:
    if not os.path.isfile(path):
        raise StorageError(f"{KEY_ENV} points at {path}, which does not exist. Fix the path or unset it.")
    try:
        kind = json.loads(Path(path).read_text(encoding="utf-8")).get("type")
    except (OSError, ValueError, AttributeError):
        raise StorageError(f"{KEY_ENV} points at {path}, which is not a JSON credentials file.") from None
    if kind not in ("service_account", "authorized_user", "external_account", "impersonated_service_account"):
        raise StorageError(f"{KEY_ENV} points at {path}, whose credential type {kind!r} is not supported.")


def _kind_only(exc: Exception) -> str:
    """An auth error's type and first line, which name the problem but never contain key material."""
    first = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {first[:120]}"


def describe(credentials) -> str:
    """Who the credentials are, for messages: never a token or key."""
    from google.auth.credentials import AnonymousCredentials

    if isinstance(credentials, AnonymousCredentials):
        return f"anonymous (emulator at {emulator_host()})" if emulator_host() else "anonymous"
    email = principal_email(credentials)
    if email:
        return f"service account {email}"
    return f"{type(credentials).__module__.split('.')[-1]} credentials (your own sign-in)"


def principal_email(credentials) -> str | None:
    email = getattr(credentials, "service_account_email", None) or getattr(credentials, "signer_email", None)
    return email if isinstance(email, str) and "@" in email else None


def member(credentials) -> str:
    """An IAM member string for these credentials, or a placeholder to fill in."""
    email = principal_email(credentials)
    if email:
        return f"serviceAccount:{email}"
    return "serviceAccount:YOUR_SERVICE_ACCOUNT@YOUR_PROJECT.iam.gserviceaccount.com"


def storage_client(workers: int = 16):
    """One shared ``google.cloud.storage.Client`` per process (thread-safe for our use)."""
    key = (environment_override(EMULATOR_ENV), environment_override(KEY_ENV))
    with _lock:
        client = _cached.get("client")
        if client is not None and _cached.get("key") == key and _cached.get("workers", 0) >= workers:
            return client
        import requests
        from google.auth.transport.requests import AuthorizedSession
        from google.cloud import storage

        credentials, project = get_credentials()
        _fetch_token(credentials)
        session = AuthorizedSession(credentials)
        adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=max(10, workers * 2))
        session.mount("https://", adapter)
        session.mount("http://", adapter)
        client = storage.Client(project=project, credentials=credentials, _http=session)
        _cached.update(client=client, key=key, workers=workers, credentials=credentials, session=session)
        log.debug("Cloud Storage client: %s", describe(credentials))
        return client


def _fetch_token(credentials) -> None:
    """Get an access token now, each try bounded: without a network or with a bad key, one clear error here
    instead of every later call retrying for minutes."""
    from google.auth.credentials import AnonymousCredentials
    from google.auth.transport.requests import Request

    if isinstance(credentials, AnonymousCredentials) or credentials.valid:
        return
    seconds = float(environment_override("TPU_PRETRAIN_GCS_RETRY_SECONDS", "30"))

    class BoundedRequest(Request):
        def __call__(self, *args, timeout=None, **kwargs):
            return super().__call__(*args, timeout=min(timeout or seconds, seconds), **kwargs)

    try:
        credentials.refresh(BoundedRequest())  # google-auth itself tries a transient failure a few times
    except Exception as exc:
        raise StorageError(
            f"Cannot get an access token for {describe(credentials)} from {_token_endpoint()} "
            f"({_network_reason(exc)}). Is this machine online, is its clock right, and is the key valid? Nothing "
            "was read or written.") from None


def _network_reason(exc: Exception) -> str:
    """The operating system's reason ("Connection refused", "Name or service not known") or the error's kind."""
    found = re.search(r"\[Errno -?\d+\] ([^'\"\])]+)", str(exc))
    return f"{type(exc).__name__}: {found.group(1)}" if found else _kind_only(exc)


def _token_endpoint() -> str:
    """Where the credentials ask for tokens (the key file says; otherwise Google's endpoint)."""
    key = environment_override(KEY_ENV)
    try:
        return json.loads(Path(key).read_text(encoding="utf-8"))["token_uri"] if key else "Google's token endpoint"
    except (OSError, ValueError, KeyError, TypeError):
        return "Google's token endpoint"


def current_credentials():
    storage_client()
    return _cached["credentials"]


def http_session():
    """The authorised HTTP session behind the shared client (resumable uploads use it)."""
    storage_client()
    return _cached["session"]


def reset() -> None:
    """Forget the cached client (after changing credentials or the emulator address)."""
    with _lock:
        _cached.clear()


def use_kaggle_secret(name: str) -> str:
    """Use a service-account key stored as a Kaggle secret: written 0600 outside any run folder."""
    from kaggle_secrets import UserSecretsClient  # type: ignore[import-not-found]

    value = UserSecretsClient().get_secret(name)
    folder = Path(os.environ.get("XDG_CONFIG_HOME", Path.home() / ".config")) / "tpu_pretrain"
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    path = folder / "service-account.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value)
    os.environ[KEY_ENV] = str(path)
    reset()
    return str(path)
