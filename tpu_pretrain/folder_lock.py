"""One process at work in a folder (a run folder for ``train``, a data folder for ``create-data``): a lock file
naming its holder, and the rule for a stale one.

Two commands writing one folder would overwrite each other's files. The first takes the lock (created
exclusively; it holds the pid, the host and the start time, and its modification time is refreshed every
:data:`HEARTBEAT_SECONDS` while the command runs); the second is refused, naming the holder. A lock is stale, and
is taken over with a message, when its process is gone (same host: that pid is not running, or is a newer process
that reused the number) or, for a holder on another machine (a Drive folder shared by two runtimes), when it has
not been refreshed for :data:`STALE_AFTER_SECONDS`.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from pathlib import Path

from .errors import UserInputError

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 30.0
STALE_AFTER_SECONDS = 180.0  # six missed heartbeats: the holder's machine is gone


class FolderLockedError(UserInputError):
    """Another process holds the folder."""


class FolderLock:
    """``with FolderLock(path, ...):`` holds a folder's lock for the block (see the module docstring).

    ``holder``: who takes it ("training process"); ``folder``: what it guards ("run folder"); ``harm``: what two at
    once would do; ``setting``: the setting that names the folder (for "use another ...").
    """

    def __init__(self, path: str | os.PathLike, holder: str, folder: str, harm: str, setting: str):
        self.path = Path(path)
        self.holder, self.folder, self.harm, self.setting = holder, folder, harm, setting
        self.me = {"pid": os.getpid(), "host": socket.gethostname()}
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def __enter__(self) -> FolderLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            try:
                self._create()
            except FileExistsError:
                self._take_over_if_stale()
                continue
            self._heartbeat = threading.Thread(target=self._beat, name="folder-lock", daemon=True)
            self._heartbeat.start()
            return
        raise FolderLockedError(f"Could not take the lock {self.path}: other processes keep taking it.")

    def _create(self) -> None:
        """Create the lock whole, or raise FileExistsError: the record is written to a file of our own and linked
        into place, so a process killed while taking the lock never leaves an empty one naming nobody (which
        would block the folder until it aged). Where links are not supported, created exclusively then written."""
        record = json.dumps({**self.me, "started": time.time()})
        mine = self.path.with_name(f".{self.path.name}.{os.getpid()}.new")
        try:
            _write_synced(mine, os.O_CREAT | os.O_TRUNC, record)  # a failure here leaves no lock at all
            try:
                os.link(mine, self.path)
                return
            except FileExistsError:
                raise
            except OSError:  # a file system without hard links
                pass
        finally:
            mine.unlink(missing_ok=True)
        _write_synced(self.path, os.O_CREAT | os.O_EXCL, record)

    def _take_over_if_stale(self) -> None:
        if self.path.exists() and not self.path.is_file():  # never a lock this tool wrote: never taken over
            kind = "a folder" if self.path.is_dir() else "not a file"
            raise FolderLockedError(
                f"The lock path {self.path} is {kind}, not a lock file: a {self.holder} takes its lock there before "
                f"it writes the {self.folder}. Move or rename it (nothing was changed), then run again.")
        found = read_lock(self.path)
        if found is None:
            return  # released in the meantime: try again
        holder, age = found
        why = stale_reason(holder, age)
        if why is None and not holder:
            raise FolderLockedError(
                f"The lock file {self.path} is unreadable: it names no holder (pid, host, start time), as a lock "
                f"being written or one this tool did not write ({age:.0f} s old). If no {self.holder} is at work in "
                f"this {self.folder}, delete it, or run again once it is {HEARTBEAT_SECONDS:.0f} s old (an unreadable "
                "lock is then taken over).")
        if why is None:
            raise FolderLockedError(
                f"Another {self.holder} holds this {self.folder}: pid {holder.get('pid')} on host "
                f"{holder.get('host')}, since {time.ctime(holder.get('started', 0))} ({self.path}). {self.harm}: "
                f"wait for it, stop it, or use another {self.setting}. If that process is gone (a runtime that "
                f"disconnected), delete the lock file, or wait {STALE_AFTER_SECONDS:.0f} s after its last heartbeat "
                "and it is taken over.")
        try:  # rename first: of two processes taking over at once, one wins and the other sees its lock
            os.replace(self.path, self.path.with_name(f".{self.path.name}.stale-{os.getpid()}"))
        except FileNotFoundError:
            return
        os.unlink(self.path.with_name(f".{self.path.name}.stale-{os.getpid()}"))
        holder_said = f"pid {holder.get('pid')} on host {holder.get('host')}" if holder else "no holder it names"
        log.warning("Took over the lock %s from %s: %s.", self.path, holder_said, why)

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                os.utime(self.path)
            except OSError:  # removed by hand, or the Drive mount hiccupped: the next beat tries again
                pass

    def release(self) -> None:
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=5)
        holder, _ = read_lock(self.path) or ({}, 0.0)
        if {k: holder.get(k) for k in self.me} == self.me:  # never remove a lock another process took over
            self.path.unlink(missing_ok=True)


def _write_synced(path: Path, flags: int, text: str) -> None:
    """Open ``path`` for writing with ``flags``, write ``text`` and reach the disk before returning."""
    with os.fdopen(os.open(path, flags | os.O_WRONLY, 0o644), "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def read_lock(path: Path) -> tuple[dict, float] | None:
    """The holder recorded in a lock file (empty if unreadable) and the seconds since its last heartbeat;
    None when there is no lock file."""
    try:
        age = time.time() - path.stat().st_mtime
        holder = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}, age
    valid = isinstance(holder, dict) and isinstance(holder.get("pid"), int)
    return (holder if valid else {}), age


def stale_reason(holder: dict, age: float) -> str | None:
    """Why a lock's holder is gone, or None while it may still be training."""
    if not holder:
        return f"the lock file is unreadable and {age:.0f} s old" if age > HEARTBEAT_SECONDS else None
    if holder.get("host") != socket.gethostname():
        return f"no heartbeat for {age:.0f} s" if age > STALE_AFTER_SECONDS else None
    import psutil

    pid = holder.get("pid")
    try:
        created = psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, ValueError, TypeError):
        return f"process {pid} is no longer running"
    if created > holder.get("started", 0) + 1:
        return f"process {pid} ended (its number now belongs to a newer process)"
    return None
