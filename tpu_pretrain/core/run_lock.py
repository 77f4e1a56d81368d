"""One training process per run folder: ``train.lock``, held while training runs (:mod:`..folder_lock`).

Two ``train`` commands on one ``output_dir`` would overwrite each other's checkpoints; the second is refused, naming
the holder, and a lock whose process is gone is taken over with a message. ``status`` names the holder too
(:func:`trainer_line`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from ..folder_lock import FolderLock, FolderLockedError, read_lock, stale_reason

RunLockedError = FolderLockedError


class RunLock(FolderLock):
    """``with RunLock(run.lock_file):`` holds the run folder's lock for the block."""

    def __init__(self, path: str | os.PathLike):
        super().__init__(path, "training process", "run folder",
                         "Two trainings in one output_dir would overwrite each other's checkpoints", "output_dir")


def trainer_line(path: str | os.PathLike) -> str:
    """``status``'s line on who trains the run now: the lock's holder (pid, host, since when), or nobody."""
    if Path(path).exists() and not Path(path).is_file():
        return f"trainer: none can start (the lock path {path} is not a file: move it away)"
    found = read_lock(Path(path))
    if found is None:
        return "trainer: none running"
    holder, age = found
    why = stale_reason(holder, age)
    if why is not None:
        return f"trainer: none running (the lock {path} is left from one that stopped: {why}; `train` takes it over)"
    if not holder:
        return f"trainer: a process is starting or holds an unreadable lock ({path}, {age:.0f} s old)"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("started", 0)))
    return (f"trainer: running, pid {holder.get('pid')} on host {holder.get('host')}, since {since} "
            f"(last heartbeat {age:.0f} s ago)")
