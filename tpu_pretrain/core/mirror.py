"""The durable copy of a run (Drive, Cloud Storage or another folder), kept current in the background and never
silently behind; bringing a run back from it.

After each checkpoint the mirror copies, in a background thread, the newest local checkpoint when the copy lacks
it (files first, ``checkpoint.json`` last, so a half-copied checkpoint never looks whole), then the ``latest``
pointer and the run files a fresh runtime needs (:data:`.run_folder.MIRRORED`), and prunes the copy to its newest
``keep`` checkpoints. Before a checkpoint is copied the room it needs is checked (Drive's bin and Kaggle's 20 GB
counted): a copy that would not fit is not started. Pruning on Drive deletes the files this tool wrote for good,
so that they stop counting against the quota (:func:`..storage.drive.remove_written`). A failed pass is retried
at the loop's next boundary, so a mirror that recovers catches up before the next save; the loop asks
:meth:`CheckpointMirror.check_before_save` at every save (and :meth:`CheckpointMirror.finish` at the end) and stops
training when the copy is too far behind, with the log saying what failed and how to fix it (:func:`fix_for`). Files
move with the run's transfer
settings (workers, retries, chunk sizes).
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import re
import threading
import time
from pathlib import Path

from .. import storage
from ..formatting import human_bytes
from ..storage import TransferOptions, drive
from ..storage.errors import InsufficientSpaceError, failure_cause
from ..storage.local import is_temp_name, write_text_atomic
from .checkpoints import (
    MANIFEST,
    POINTER,
    CheckpointInfo,
    CheckpointManager,
    checkpoint_name,
    list_checkpoints,
    step_of,
)
from .mirror_owner import check_fetch_target, keep_claim
from .run_folder import CHECKPOINTS, MIRRORED, RunFolder, config_file_at

log = logging.getLogger(__name__)

CAUSES = {"quota": "no room (quota or disk full)", "permissions": "no permission to write",
          "network": "the network or the storage service is unreachable"}


class CheckpointMirror:
    """Copies a run folder's newest checkpoint and its run files to ``url`` (a Drive folder, ``gs://`` prefix or
    folder), keeping the ``keep`` newest checkpoints there."""

    retry_seconds = 30.0  # a failed pass is tried again at the first boundary this long after it

    def __init__(self, run: RunFolder, url: str, *, keep: int = 2, options: TransferOptions | None = None,
                 max_lag: int = 2, on_failure: str = "stop"):
        self.run, self.url, self.keep, self.max_lag, self.on_failure = run, url, keep, max_lag, on_failure
        self.checkpoints_url = storage.join(url, CHECKPOINTS)
        self.options = options or TransferOptions(progress=False)
        self.wait_seconds = 600.0  # the longest a save waits for a copy under way, and the end for the last one
        self.error: str | None = None  # why the last pass failed, as the storage layer said it
        self.cause: str | None = None  # quota, permissions or network (:data:`CAUSES`), when known
        self.durable_step: int | None = None  # the newest complete checkpoint in the copy
        self.bin_bytes = 0  # bytes this run sent to Drive's bin (replaced run files); they still count
        self.copying: str | None = None  # the checkpoint being copied now
        self._saved: list[int] = []  # steps saved locally that the copy may lack
        self._saved_lock = threading.Lock()
        self._failed_at = 0.0
        self.stopped = False  # a stop for this copy was asked (and said)
        self._left_alone: set[int] = set()  # old checkpoint folders holding only files this tool did not write
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="mirror")
        self._pending: concurrent.futures.Future | None = None
        self._lock = threading.Lock()

    # -- keeping the copy current ---------------------------------------------------------------------
    def start(self, local_step: int | None) -> None:
        """At the start of a session: how far behind the copy is, and a first pass to catch up when it is."""
        if self.durable_step is None:
            self.durable_step = self.newest_step()
        if local_step is not None and (self.durable_step is None or local_step > self.durable_step):
            self.schedule(local_step)

    def schedule(self, step: int | None = None) -> None:
        """Copy what the copy lacks, in the background; ``step``: the checkpoint just saved locally."""
        if step is not None:
            with self._saved_lock:
                self._saved.append(step)
        self._pending = self._executor.submit(self._pass)

    def retry_if_failed(self) -> None:
        """Try again (in the background) when the last pass failed and none is under way: a recovered mirror
        catches up between saves."""
        idle = self._pending is None or self._pending.done()
        if self.error is not None and idle and time.monotonic() - self._failed_at >= self.retry_seconds:
            self.schedule()

    def behind(self) -> int:
        """Checkpoints saved locally that the copy does not hold yet (one being copied counts)."""
        durable = -1 if self.durable_step is None else self.durable_step
        with self._saved_lock:
            self._saved = [s for s in self._saved if s > durable]
            return len(self._saved)

    def _pass(self) -> None:
        with self._lock:
            try:
                keep_claim(self.url, self.run)  # before a checkpoint goes there, and before any is pruned
                self._copy_newest()
                self._prune()
                self._sync_run_files()
                self.error = self.cause = None
            except Exception as exc:
                said, self._failed_at = _gist(self.error), time.monotonic()
                self.error, self.cause = str(exc), failure_cause(exc)
                (log.debug if _gist(self.error) == said else log.warning)(  # a failure that repeats is said once
                    "The durable copy at %s failed (%s): %s", self.url, CAUSES.get(self.cause, "see why"), self.error)
            self._record_state()

    def _copy_newest(self) -> None:
        local = list_checkpoints(self.run.checkpoints)
        if not local or (self.durable_step is not None and local[0].step <= self.durable_step):
            return
        newest = local[0]
        self.copying = newest.name  # the local pruning leaves it alone meanwhile
        try:
            if not storage.exists(storage.join(self.checkpoints_url, newest.name, MANIFEST)):
                self._copy_checkpoint(newest)
        finally:
            self.copying = None
        pointer = storage.join(self.checkpoints_url, POINTER)
        self.bin_bytes += _size_if_drive(pointer)  # replaced: on Drive the old one goes to the bin
        storage.write_text(pointer, newest.name + "\n")
        self.durable_step = newest.step

    def _copy_checkpoint(self, info: CheckpointInfo) -> None:
        remote = storage.join(self.checkpoints_url, info.name)
        names = sorted(os.listdir(info.path))
        sizes = {n: os.path.getsize(os.path.join(info.path, n)) for n in names}
        there = dict(storage.list_files(remote)) if storage.exists(remote) else {}
        self._check_room(info.name, sum(s for n, s in sizes.items() if there.get(n) != s))
        started = time.perf_counter()
        for file in [n for n in names if n != MANIFEST] + [MANIFEST]:
            storage.copy(os.path.join(info.path, file), storage.join(remote, file), self.options)
        log.info("Durable copy: %s (%s) in %s in %.0f s.", info.name, human_bytes(sum(sizes.values())), self.url,
                 time.perf_counter() - started)

    def _check_room(self, name: str, needed: int) -> None:
        """Refuse, before writing anything, a copy that would not fit (counting what this run put in the bin)."""
        free = storage.free_space(self.checkpoints_url)
        if free is None:  # a bucket: no fixed size
            return
        margin = drive.margin_for(self.checkpoints_url)
        if needed + margin + self.bin_bytes > free:
            bin_note = f", + {human_bytes(self.bin_bytes)} this run sent to Drive's bin" if self.bin_bytes else ""
            raise InsufficientSpaceError(
                f"No room for checkpoint {name} in {self.url}: it needs {human_bytes(needed)} (+{human_bytes(margin)} "
                f"margin{bin_note}) but {human_bytes(free)} is free{_where_space_goes(self.url)}; the copy was not "
                "started.")

    def _prune(self) -> None:
        if self.durable_step is None:
            return
        steps = self._steps()
        complete = [s for s in sorted(steps) if MANIFEST in steps[s]]
        kept = set(complete[-self.keep:]) | {self.durable_step}
        for step in sorted(steps):
            if step not in kept and step < self.durable_step:
                self._remove(step, steps[step])

    def _remove(self, step: int, listed: dict[str, int]) -> None:
        """Delete a pruned checkpoint's files that this tool wrote: those its manifest lists, the manifest itself
        and unfinished copies; anything else in its folder stays."""
        name = checkpoint_name(step)
        folder = storage.join(self.checkpoints_url, name)
        names = self._written_names(folder, name, listed)
        written = {n: size for n, size in listed.items() if n in names or is_temp_name(n)}
        if not written:
            if step not in self._left_alone:
                self._left_alone.add(step)
                log.warning("Durable copy: %s holds no file this tool wrote (%s): left alone.", folder,
                            ", ".join(sorted(listed)))
            return
        if storage.is_gcs_url(folder):
            for file in written:
                storage.delete(storage.join(folder, file))
        elif drive.is_drive_path(folder):
            permanent, emptied = drive.remove_written(folder, written)
            how = f"{permanent} file(s) deleted for good" if not emptied else (
                f"{permanent} deleted for good, {emptied} emptied before deletion (no Drive sign-in: the bin keeps "
                "them, without their bytes)")
            log.info("Durable copy: pruned %s from %s (%s).", name, self.url, how)
        else:
            for file in written:
                os.unlink(os.path.join(folder, file))
            if os.path.isdir(folder) and not os.listdir(folder):
                os.rmdir(folder)

    def _written_names(self, folder: str, name: str, listed: dict[str, int]) -> set[str]:
        """The files a checkpoint's manifest lists (the copy's own, else the local one), and the manifest."""
        local = os.path.join(self.run.checkpoints, name, MANIFEST)
        manifest = storage.join(folder, MANIFEST) if MANIFEST in listed else local if os.path.isfile(local) else None
        return set(json.loads(storage.read_text(manifest))["files"]) | {MANIFEST} if manifest else set()

    def _sync_run_files(self) -> None:
        """What a fresh runtime needs to continue, and the curves; on Drive a replaced file goes to the bin."""
        for name in MIRRORED:
            local = self.run.path / name
            if not local.exists():
                continue
            remote = storage.join(self.url, name)
            before = _drive_sizes(remote)
            summary = storage.sync(str(local), remote, self.options)
            self.bin_bytes += sum(before.get(os.path.normpath(r.dest), 0) for r in summary.sent)

    def _record_state(self) -> None:
        """Where the copy stands, for ``tpu-pretrain status`` (read by :func:`mirror_state`)."""
        state = {"url": self.url, "durable_step": self.durable_step, "behind": self.behind(), "error": self.error,
                 "cause": self.cause, "time": time.time()}
        try:
            write_text_atomic(self.run.mirror_state_file, json.dumps(state, indent=2) + "\n")
        except OSError as exc:  # the status line is a convenience; the loop reads the state itself
            log.debug("Cannot record the mirror's state: %s", exc)

    def wait(self, timeout: float | None = None, retry: bool = True) -> bool:
        """Block until the copy holds the newest local checkpoint (one more try if the last pass failed)."""
        if self._pending is not None:
            concurrent.futures.wait([self._pending], timeout=timeout)
        if retry and self.error is not None:
            self.schedule()
            concurrent.futures.wait([self._pending], timeout=timeout)
        return self.error is None and (self._pending is None or self._pending.done())

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    # -- saying so -------------------------------------------------------------------------------------
    def note(self) -> str:
        """For the progress line: the newest durable step, and how far behind the copy is when it is."""
        behind = self.behind()
        durable = "none yet" if self.durable_step is None else f"step {self.durable_step}"
        failing = f", failing: {CAUSES.get(self.cause, 'see the warning')}" if self.error else ""
        return f"durable {durable}" + (f", {behind} behind" if behind > 1 or self.error else "") + failing

    def check_before_save(self, step: int) -> str | None:
        """At a save of ``step``: why training must stop after it, the copy being too far behind; None to go on."""
        if self.behind() + 1 > self.max_lag and self.error is None and not self.wait(0, retry=False):
            log.warning("The durable copy at %s is %d checkpoints behind: waiting for the copy under way before "
                        "saving step %d (copying is slower than saving: save less often).", self.url, self.behind(),
                        step)
            self.wait(self.wait_seconds, retry=False)
        behind = self.behind() + 1  # with the checkpoint about to be saved
        if behind <= self.max_lag:
            return None
        return self._too_far_behind(f"is {behind} checkpoints behind the run", step)

    def finish(self, step: int) -> str | None:
        """At the end of a session: wait for the copy of the newest checkpoint; why the run must report a stop
        when the copy still lacks it (None when it holds it, or when the user chose to continue)."""
        try:
            current = self.wait(self.wait_seconds) and self.behind() == 0
        finally:
            self.close()
        if current or self.stopped:  # a stop for the copy has been said already
            return None
        return self._too_far_behind(f"lacks the newest checkpoint (step {step})", step)

    def _too_far_behind(self, how: str, step: int) -> str | None:
        newest = "none" if self.durable_step is None else f"step {self.durable_step}"
        if self.error is None:  # nothing failed: copying is slower than saving
            problem = ("copying a checkpoint takes longer than the time between saves. Save less often (raise "
                       "--save_checkpoints_minutes or --save_checkpoints_steps), or mirror to a faster place.")
        else:
            problem = (f"{CAUSES.get(self.cause, 'it failed')}: {self.error.rstrip('.')}. "
                       f"{fix_for(self.cause, self.url, self.keep)}")
        message = f"The durable copy at {self.url} {how} (newest there: {newest}): {problem}"
        if self.on_failure == "continue":
            log.warning("%s Training goes on (--mirror_failure continue): a disconnect now loses every step after "
                        "%s.", message, newest)
            return None
        log.error("%s Training saved step %d in %s and stopped. Fix the cause, then run the same command again: the "
                  "copy catches up first, then training continues from step %d. (--mirror_failure continue keeps "
                  "training while the copy is behind; a disconnect then loses what it lacks.)", message, step,
                  self.run.checkpoints, step)
        self.stopped = True
        why = CAUSES.get(self.cause, "it failed" if self.error else "copying is slower than saving")
        return f"the durable copy at {self.url} {how}: {why}"

    # -- reading --------------------------------------------------------------------------------------
    def _steps(self) -> dict[int, dict[str, int]]:
        """The copy's checkpoint folders by step, with the files (and sizes) each holds."""
        steps: dict[int, dict[str, int]] = {}
        if not storage.exists(self.checkpoints_url):
            return steps
        for rel, size in storage.list_files(self.checkpoints_url):
            parts = rel.replace("\\", "/").split("/")
            step = step_of(parts[0]) if len(parts) == 2 else None
            if step is not None:
                steps.setdefault(step, {})[parts[1]] = size
        return steps

    def complete_steps(self) -> list[int]:
        """The steps of the complete checkpoints in the copy, oldest first (raises when it cannot be listed)."""
        return sorted(s for s, files in self._steps().items() if MANIFEST in files)

    def newest_step(self) -> int | None:
        """The newest complete checkpoint in the copy (None when there is none or it cannot be listed)."""
        try:
            complete = self.complete_steps()
        except Exception as exc:
            log.warning("Cannot list the checkpoint mirror %s: %s", self.checkpoints_url, exc)
            return None
        return complete[-1] if complete else None

    def holds(self, name: str) -> bool:
        """Whether the mirror holds the complete checkpoint ``name``."""
        return storage.exists(storage.join(self.checkpoints_url, name, MANIFEST))

    def fetch(self, name: str, destination: Path) -> None:
        storage.sync(storage.join(self.checkpoints_url, name), str(destination), self.options)
        log.info("Fetched checkpoint %s from the mirror %s.", name, self.url)


def fix_for(cause: str | None, url: str, keep: int) -> str:
    """How a user fixes a durable copy that failed for ``cause``, at ``url``."""
    on_drive, bucket = drive.is_drive_path(url), storage.is_gcs_url(url)
    if cause == "quota" and on_drive:
        return (f"Free space in Google Drive and empty its bin (drive.google.com > Bin > Empty bin: files there still "
                f"count against the quota), or lower --mirror_keep (now {keep}), or mirror to a gs:// bucket.")
    if cause == "quota":
        return (f"Delete other files there (Kaggle's /kaggle/working keeps at most 20 GB) or lower --mirror_keep (now "
                f"{keep}), or choose another --mirror_dir.")
    if cause == "permissions" and bucket:
        return (f"Give the credentials write access to the bucket: `tpu-pretrain storage-check "
                f"gs://{storage.GcsPath.parse(url).bucket}` says what they lack and the commands that grant it.")
    if cause == "permissions" and on_drive:
        return ("Make sure the folder is yours and writable, and remount Drive (`from google.colab import drive; "
                "drive.mount('/content/drive', force_remount=True)`).")
    if cause == "permissions":
        return f"Make {url} writable, or choose another --mirror_dir."
    if cause == "network" and on_drive:
        return ("Check this runtime's connection, then remount Drive (`drive.flush_and_unmount()`, then "
                "`drive.mount('/content/drive')`).")
    if cause == "network":
        return "Check this machine's network connection and that the bucket exists (`tpu-pretrain storage-check`)."
    return "Fix what the error names, or choose another --mirror_dir."


def mirror_state(run: RunFolder) -> dict | None:
    """The durable copy's state as the training process last recorded it, or None."""
    try:
        return json.loads(run.mirror_state_file.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _gist(error: str | None) -> str | None:
    """An error without its numbers (checkpoint names, sizes, times), to tell a repeated failure from a new one."""
    return None if error is None else re.sub(r"\d+(\.\d+)?", "#", error)


def _where_space_goes(url: str) -> str:
    if drive.is_drive_path(url):
        return " on Google Drive (files in its bin count as used)"
    return " (Kaggle's /kaggle/working keeps at most 20 GB)" if url.startswith(drive.KAGGLE_WORKING) else ""


def _size_if_drive(path: str) -> int:
    return os.path.getsize(path) if drive.is_drive_path(path) and os.path.isfile(path) else 0


def _drive_sizes(path: str) -> dict[str, int]:
    """Sizes of the files at a Drive path (a file or a folder), by normalised path; empty elsewhere."""
    if not drive.is_drive_path(path) or not os.path.exists(path):
        return {}
    if os.path.isfile(path):
        return {os.path.normpath(path): os.path.getsize(path)}
    return {os.path.normpath(os.path.join(path, rel)): size for rel, size in storage.list_files(path)}


def fetch_run(mirror: str, run_dir: str | os.PathLike, options: TransferOptions | None = None) -> bool:
    """Bring a run from its mirror to a new runtime's local folder: its run files and its newest complete
    checkpoint, so that ``train``, ``evaluate`` and ``export`` work there. False when the mirror holds no run."""
    if not storage.exists(config_file_at(mirror)):
        return False
    run = RunFolder(run_dir)
    check_fetch_target(mirror, run)
    run.path.mkdir(parents=True, exist_ok=True)
    for name in MIRRORED:
        remote = storage.join(mirror, name)
        if storage.exists(remote):
            storage.sync(remote, str(run.path / name), options)
    copy = CheckpointMirror(run, mirror, options=options)
    try:
        CheckpointManager(run.checkpoints, checkpoint=None, mirror=copy).newest_valid()
    finally:
        copy.close()
    return True
