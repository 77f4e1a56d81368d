"""How many checkpoints fit where, said and checked before training starts.

The run folder and its durable copy each keep their newest checkpoints (``keep_checkpoint_max``,
``mirror_keep``) and hold one more while a new one is written or copied. Each is sized against the free space
of its place (on Drive the quota, whose bin counts as used; Kaggle's ``/kaggle/working`` at most 20 GB), the
run's own checkpoints already there counted as room, since pruning frees them. The run's first line says how
big a checkpoint is, how many fit in each place and what the kept ones leave; a keep that does not fit is
refused before the first step, when fixing it costs nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .. import storage
from ..config import StorageConfig
from ..formatting import human_bytes
from ..storage import drive
from .checkpoints import CheckpointError, list_checkpoints, step_of
from .run_folder import CHECKPOINTS, RunFolder


@dataclass
class Room:
    """One place that keeps checkpoints, and what it has room for."""

    path: str
    setting: str  # the setting that says how many are kept there
    keep: int
    free: int | None  # None: no fixed size (a bucket)
    ours: int  # bytes of this run's checkpoints already there (pruning frees them)
    margin: int

    def fits(self, size: int) -> int:
        return max(0, (self.free + self.ours - self.margin) // size) if self.free is not None else 0

    def leaves(self, size: int) -> int:
        return self.free + self.ours - (self.keep + 1) * size

    def describe(self, size: int, while_: str) -> str:
        where = f"{self.path} ({place(self.path)})"
        if self.free is None:
            return f"{where}: keeping {self.keep}"
        return (f"{where}: {self.fits(size)} fit in {human_bytes(self.free + self.ours)}; keeping {self.keep} "
                f"({self.keep + 1} {while_}) leaves {human_bytes(self.leaves(size))}")


def place(path: str) -> str:
    """What kind of place ``path`` is, as the space messages name it."""
    if storage.is_gcs_url(path):
        return "a Cloud Storage bucket, no fixed size"
    if drive.is_drive_path(path):
        return "Google Drive: its bin counts as used"
    if os.path.abspath(path).startswith(drive.KAGGLE_WORKING + "/"):
        return "Kaggle's output: at most 20 GB"
    return "local disk"


def check_rooms(run: RunFolder, settings: StorageConfig, checkpoint_bytes: int, margin: int) -> str:
    """The line that says how many checkpoints fit where; raises :class:`CheckpointError` when a keep does not fit."""
    size = max(checkpoint_bytes, _newest_size(str(run.checkpoints)))
    local = Room(str(run.checkpoints), "keep_checkpoint_max", settings.keep_checkpoint_max,
                 drive.free_space(run.checkpoints), _bytes_under(str(run.checkpoints)), margin)
    parts = [f"Checkpoints: about {human_bytes(size)} each. Run folder {local.describe(size, 'while saving')}"]
    rooms = [local]
    if settings.mirror_dir:
        url = storage.join(settings.mirror_dir, CHECKPOINTS)
        free = storage.free_space(url)
        mirror = Room(settings.mirror_dir, "mirror_keep", settings.mirror_keep, free,
                      _bytes_under(url) if free is not None else 0, drive.margin_for(url))
        parts.append(f"Durable copy {mirror.describe(size, 'while copying')}")
        rooms.append(mirror)
    for room in rooms:
        if room.free is not None and room.leaves(size) < room.margin:
            raise CheckpointError(_refusal(room, size))
    return ". ".join(parts) + "."


def _refusal(room: Room, size: int) -> str:
    short = room.margin - room.leaves(size)
    lower = (f"lower --{room.setting} to {room.fits(size) - 1}, or " if room.fits(size) >= 2 else "")
    on_drive = drive.is_drive_path(room.path)
    bin_note = " and empty its bin (files there still count against the quota)" if on_drive else ""
    return (f"Checkpoints of this run take about {human_bytes(size)} each, and {room.setting}={room.keep} needs room "
            f"for {room.keep + 1} ({room.keep} kept + the one being written): {human_bytes((room.keep + 1) * size)} "
            f"(+{human_bytes(room.margin)} margin). {room.path} ({place(room.path)}) has "
            f"{human_bytes(room.free)} free, {human_bytes(room.ours)} of it this run's checkpoints: room for "
            f"{room.fits(size)}. Nothing was trained; {lower}free at least {human_bytes(short)} there{bin_note}, then "
            "start again.")


def _bytes_under(path: str) -> int:
    """Bytes of the checkpoint folders in a local or Drive ``checkpoints`` folder (0 when there is none)."""
    if storage.is_gcs_url(path) or not os.path.isdir(path):
        return 0
    return sum(size for rel, size in storage.list_files(path) if step_of(rel.split("/")[0]) is not None)


def _newest_size(directory: str) -> int:
    newest = list_checkpoints(directory)
    return sum(size for _, size in storage.list_files(newest[0].path)) if newest else 0
