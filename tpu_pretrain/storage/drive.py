"""Google Drive on Colab: detection, mounting on request, and free-space checks before big writes.

Drive appears on Colab as a mounted folder, so reads and writes go through the local backend; what
Drive adds is a quota that runs out (a half-written checkpoint is worse than none), so large writes
are preceded by :func:`ensure_free_space`.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ..formatting import human_bytes
from ..runtime import in_colab
from .errors import InsufficientSpaceError, StorageError

DRIVE_ROOT = "/content/drive"
# Keep this much free beyond the file itself: Drive's FUSE layer caches files locally while syncing.
SAFETY_MARGIN = 64 * 1024 * 1024


def is_drive_path(path: str | os.PathLike) -> bool:
    return os.path.abspath(os.fspath(path)).startswith(DRIVE_ROOT + "/") or os.fspath(path) == DRIVE_ROOT


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
    if not is_drive_path(path) or is_mounted():
        return
    if mount:
        mount_drive()
        return
    raise StorageError(
        f"{path} is on Google Drive, which is not mounted. Mount it first: "
        "`from google.colab import drive; drive.mount('/content/drive')`, or pass --mount_drive."
    )


def free_space(path: str | os.PathLike) -> int | None:
    """Bytes free where ``path`` would be written (its nearest existing parent), None if unknown."""
    p = Path(os.path.abspath(os.fspath(path)))
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def ensure_free_space(path: str | os.PathLike, needed: int, what: str = "this file") -> None:
    """Fail early, saying how much is needed and what to delete, if ``needed`` bytes will not fit."""
    free = free_space(path)
    if free is None or needed + SAFETY_MARGIN <= free:
        return
    where = "Google Drive" if is_drive_path(path) else "the disk"
    hint = (
        "Delete older checkpoints (lower keep_checkpoint_max) or other files in Drive, then empty "
        "Drive's trash (trashed files still count against the quota), or write to a gs:// bucket."
        if is_drive_path(path)
        else "Delete old checkpoints or other files on that disk, or write somewhere with more room."
    )
    raise InsufficientSpaceError(
        f"Not enough space on {where} for {what} at {path}: it needs {human_bytes(needed)} "
        f"(+{human_bytes(SAFETY_MARGIN)} margin) but only {human_bytes(free)} is free; free at least "
        f"{human_bytes(needed + SAFETY_MARGIN - free)}. {hint}"
    )
