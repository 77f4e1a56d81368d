"""The two Drive REST calls the checkpoint mirror needs: what a file id names, and deleting that file for good.

Files deleted through Colab's Drive mount go to Drive's bin and keep counting against the quota until the bin is
emptied (gpt-2-simple #155, rclone #326, google-drive-ocamlfuse #242); ``files.delete`` "permanently deletes a file
owned by the user without moving it to the trash" (Drive API v3 reference). The calls need the user's sign-in with
Drive access: on Colab, ``google.colab.auth.authenticate_user()`` signs in with ``--enable-gdrive-access`` (Colab's
own ``google/colab/sheets.py`` then asks ``google.auth.default`` for the ``drive`` scope, as this module does).
"""

from __future__ import annotations

import logging

from .errors import PermissionDeniedError, StorageError

log = logging.getLogger(__name__)

API_URL = "https://www.googleapis.com/drive/v3"
SCOPE = "https://www.googleapis.com/auth/drive"
FIELDS = "id,name,size,trashed,ownedByMe"


class DriveApi:
    """``files.get`` and ``files.delete`` over an authorised HTTP session (``requests``-like)."""

    def __init__(self, session, url: str = API_URL, timeout: float = 30.0):
        self.session, self.url, self.timeout = session, url.rstrip("/"), timeout

    @classmethod
    def from_sign_in(cls) -> DriveApi | None:
        """The API with the user's sign-in (Colab's, or application default credentials), None without one."""
        try:
            import google.auth
            from google.auth.transport.requests import AuthorizedSession

            credentials, _ = google.auth.default(scopes=[SCOPE])
        except Exception as exc:  # no sign-in here: the caller falls back to the mount
            log.debug("No Drive API sign-in: %s", exc)
            return None
        return cls(AuthorizedSession(credentials))

    def metadata(self, file_id: str) -> dict | None:
        """Name, size, whether trashed and owned by the user; None when the id names no file this user sees."""
        response = self._call("GET", file_id, {"fields": FIELDS, "supportsAllDrives": "true"})
        return None if response is None else response.json()

    def delete(self, file_id: str) -> None:
        """Delete the file for good (not into the bin); a file already gone is no error."""
        self._call("DELETE", file_id, {"supportsAllDrives": "true"})

    def _call(self, method: str, file_id: str, params: dict):
        what = f"Drive file {file_id}"
        try:
            response = self.session.request(method, f"{self.url}/files/{file_id}", params=params, timeout=self.timeout)
        except Exception as exc:
            raise StorageError(f"{what}: cannot reach the Drive API ({type(exc).__name__}: {exc}).") from None
        if response.status_code == 404:
            return None
        if response.status_code in (401, 403):
            raise PermissionDeniedError(f"{what}: the Drive API refused ({response.status_code}): the sign-in lacks "
                                        "Drive access (on Colab: run `from google.colab import auth; "
                                        "auth.authenticate_user()` and allow Drive).")
        if response.status_code >= 400:
            raise StorageError(f"{what}: the Drive API answered {response.status_code} to {method}.")
        return response
