"""Google Drive on Colab: detection, mounting on request, free-space checks, and deletions that free the quota.

Drive appears on Colab as a mounted folder (DriveFS over FUSE), so reads and writes go through the local
backend; what Drive adds is a quota that runs out (a half-written checkpoint is worse than none), so large
writes are preceded by :func:`ensure_free_space`, and a bin: a file deleted through the mount goes there and
keeps counting against the quota until the bin is emptied. :func:`remove_written` deletes the files this
tool wrote for good instead (see :mod:`.drive_api`). Every Drive operation goes through one
:class:`DriveMount`, which tests replace with a Drive-like folder (:func:`use_mount`).

:func:`free_space` also knows Kaggle's limit: ``/kaggle/working`` keeps at most 20 GB, whatever its disk holds.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from ..formatting import human_bytes
from ..runtime import in_colab
from .errors import InsufficientSpaceError, StorageError

log = logging.getLogger(__name__)

DRIVE_ROOT = "/content/drive"
# Keep this much free beyond the file itself: Drive's FUSE layer caches files locally while syncing.
SAFETY_MARGIN = 64 * 1024 * 1024
FILE_ID_ATTRIBUTE = "user.drive.id"  # DriveFS names each file's Drive id in this extended attribute
KAGGLE_WORKING = "/kaggle/working"
KAGGLE_WORKING_LIMIT = 20 * 1000**3  # what a Kaggle notebook's output may hold


class DriveMount:
    """Google Drive as Colab mounts it: a folder whose free space is the quota's (the bin counts as used),
    whose files carry their Drive ids, and whose deletions go to the bin."""

    margin = SAFETY_MARGIN

    def __init__(self, root: str = DRIVE_ROOT):
        self.root = root
        self.deleted_ids: set[str] = set()  # deleted through the API; the mount may still list them a while
        self._api, self._api_tried = None, False

    def free_space(self, path: str) -> int | None:
        return _disk_free(path)

    def file_id(self, path: str) -> str | None:
        """The Drive id of a file on the mount; None before DriveFS has uploaded it (a ``local-`` id) or elsewhere."""
        try:
            value = os.getxattr(path, FILE_ID_ATTRIBUTE).decode().strip()
        except (OSError, AttributeError):
            return None
        return value if value and not value.startswith("local") else None

    def trash(self, path: str) -> None:
        """Delete through the mount: Drive moves the file to its bin."""
        os.unlink(path)

    def api(self):
        """The Drive API with the user's sign-in (asked once), or None."""
        if not self._api_tried:
            from .drive_api import DriveApi

            self._api, self._api_tried = DriveApi.from_sign_in(), True
        return self._api


_mount = DriveMount()


def mount() -> DriveMount:
    return _mount


def use_mount(drive_mount: DriveMount) -> DriveMount:
    """Make ``drive_mount`` the Drive every operation uses (tests: a Drive-like folder); returns the previous one."""
    global _mount
    previous, _mount = _mount, drive_mount
    return previous


def is_drive_path(path: str | os.PathLike) -> bool:
    root = _mount.root
    return os.path.abspath(os.fspath(path)).startswith(root + "/") or os.fspath(path) == root


def is_mounted(root: str = DRIVE_ROOT) -> bool:
    return os.path.isdir(os.path.join(root, "MyDrive"))


def mount_drive(root: str = DRIVE_ROOT) -> str:
    """Mount Google Drive at ``root`` (asks the user to sign in once); return the MyDrive folder."""
    if is_mounted(root):
        return os.path.join(root, "MyDrive")
    if not in_colab():
        raise StorageError(
            f"Cannot mount Google Drive at {root}: this is not a Colab runtime. Elsewhere, use a local "
            "folder or a gs:// bucket (or Google Drive for desktop, and pass its folder)."
        )
    from google.colab import drive  # type: ignore[import-not-found]

    drive.mount(root)
    return os.path.join(root, "MyDrive")


def ensure_drive_ready(path: str | os.PathLike, mount: bool = False) -> None:
    """Before using a path under /content/drive: mount Drive if asked, or say how to."""
    if not is_drive_path(path) or is_mounted(_mount.root):
        return
    if mount:
        mount_drive()
        return
    raise StorageError(
        f"{path} is on Google Drive, which is not mounted. Mount it first: "
        "`from google.colab import drive; drive.mount('/content/drive')`, or pass --mount_drive."
    )


def _disk_free(path: str | os.PathLike) -> int | None:
    p = Path(os.path.abspath(os.fspath(path)))
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def free_space(path: str | os.PathLike) -> int | None:
    """Bytes free where ``path`` would be written (its nearest existing parent), None if unknown: on Drive the
    quota's free bytes (its bin counts as used), under Kaggle's /kaggle/working at most what its 20 GB leave."""
    if is_drive_path(path):
        return _mount.free_space(os.fspath(path))
    free = _disk_free(path)
    working = os.path.abspath(KAGGLE_WORKING)
    if free is not None and (os.path.abspath(os.fspath(path)) + "/").startswith(working + "/"):
        used = sum(f.stat().st_size for f in Path(working).rglob("*") if f.is_file() and not f.is_symlink())
        free = max(0, min(free, KAGGLE_WORKING_LIMIT - used))
    return free


def margin_for(path: str | os.PathLike) -> int:
    return _mount.margin if is_drive_path(path) else SAFETY_MARGIN


def ensure_free_space(path: str | os.PathLike, needed: int, what: str = "this file") -> None:
    """Fail early, saying how much is needed and what to delete, if ``needed`` bytes will not fit."""
    free, margin = free_space(path), margin_for(path)
    if free is None or needed + margin <= free:
        return
    where = "Google Drive" if is_drive_path(path) else "the disk"
    hint = (
        "Delete older checkpoints (lower mirror_keep) or other files in Drive, then empty "
        "Drive's bin, or trash (files there still count against the quota), or write to a gs:// bucket."
        if is_drive_path(path)
        else "Delete old checkpoints or other files on that disk, or write somewhere with more room."
    )
    raise InsufficientSpaceError(
        f"Not enough space on {where} for {what} at {path}: it needs {human_bytes(needed)} "
        f"(+{human_bytes(margin)} margin) but only {human_bytes(free)} is free; free at least "
        f"{human_bytes(needed + margin - free)}. {hint}"
    )


def remove_written(folder: str, files: dict[str, int]) -> tuple[int, int]:
    """Make files this tool wrote in a Drive folder stop counting against the quota: ``(deleted for good, emptied)``.

    ``files``: name -> the size it was written with. Each is deleted for good through the Drive API when the user's
    sign-in allows it, and only after the API says the id behind the path is that file (same name and size, not
    trashed); otherwise it is emptied, then deleted through the mount, so that the bin keeps an empty file. Any
    other file (another size, another name) is left alone, and so is the folder then.
    """
    permanent, emptied = 0, 0
    for name, size in files.items():
        path = os.path.join(folder, name)
        if not os.path.isfile(path) or os.path.getsize(path) != size:
            continue  # gone already, or not the file this tool wrote
        file_id = _mount.file_id(path)
        if file_id is not None and file_id in _mount.deleted_ids:
            continue  # deleted for good already; the mount has not caught up yet
        if file_id is not None and _delete_through_api(file_id, name, size):
            permanent += 1
            continue
        os.truncate(path, 0)  # the bin gets the file without its bytes
        _mount.trash(path)
        emptied += 1
    try:
        os.rmdir(folder)  # an empty folder, which takes no quota
    except OSError:
        pass  # files the mount still shows, or files this tool did not write: left alone
    return permanent, emptied


def _delete_through_api(file_id: str, name: str, size: int) -> bool:
    api = _mount.api()
    if api is None:
        return False
    try:
        found = api.metadata(file_id)
        if not found or found.get("name") != name or int(found.get("size", -1)) != size or found.get("trashed"):
            log.debug("Drive id %s of %s names %s: not deleted through the API.", file_id, name, found)
            return False
        api.delete(file_id)
    except StorageError as exc:
        log.warning("Deleting %s through the Drive API failed (%s); emptying it before deleting it instead.", name, exc)
        return False
    _mount.deleted_ids.add(file_id)
    return True
