"""One training process per run folder: ``train.lock``, held while training runs (:mod:`..folder_lock`).

Two ``train`` commands on one ``output_dir`` would overwrite each other's checkpoints; the second is refused, naming
the holder, and a lock whose process is gone is taken over with a message.
"""

from __future__ import annotations

import os

from ..folder_lock import FolderLock, FolderLockedError

RunLockedError = FolderLockedError


class RunLock(FolderLock):
    """``with RunLock(run.lock_file):`` holds the run folder's lock for the block."""

    def __init__(self, path: str | os.PathLike):
        super().__init__(path, "training process", "run folder",
                         "Two trainings in one output_dir would overwrite each other's checkpoints", "output_dir")
