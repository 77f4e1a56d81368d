"""The background copy of a run to Drive or Cloud Storage, and bringing a run back from it.

After each checkpoint the mirror copies, in a background thread, every complete local checkpoint it
lacks (files first, ``checkpoint.json`` last, so a half-copied checkpoint never looks whole), the
``latest`` pointer, and the run files a fresh runtime needs (config, identity, model shape, vocab,
logs: :data:`.run_folder.MIRRORED`), then prunes old checkpoints there too. A slow or vanished network
stays off the training loop's path: a failure is logged and retried at the next checkpoint. It moves
files with the run's transfer settings (workers, retries, chunk sizes).
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
from pathlib import Path

from .. import storage
from ..storage import TransferOptions
from .checkpoints import MANIFEST, POINTER, CheckpointManager, checkpoint_name, list_checkpoints, step_of
from .run_folder import CHECKPOINTS, CONFIG, MIRRORED, RunFolder

log = logging.getLogger(__name__)


class CheckpointMirror:
    """Copies a run folder's checkpoints and run files to ``url`` (a Drive folder or ``gs://`` prefix)."""

    def __init__(self, run: RunFolder, url: str, *, keep_max: int = 5, options: TransferOptions | None = None):
        self.run = run
        self.url = url
        self.checkpoints_url = storage.join(url, CHECKPOINTS)
        self.keep_max = keep_max
        self.options = options or TransferOptions(progress=False)
        self.error: str | None = None
        self._mirrored: set[str] = set()
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="mirror")
        self._pending: concurrent.futures.Future | None = None
        self._lock = threading.Lock()

    # -- writing --------------------------------------------------------------------------------------
    def schedule(self) -> None:
        """Start copying what the mirror lacks, in the background."""
        self._pending = self._executor.submit(self._mirror_all)

    def _mirror_all(self) -> None:
        with self._lock:
            try:
                local = list_checkpoints(self.run.checkpoints)
                for info in sorted(local, key=lambda c: c.step):
                    if info.name not in self._mirrored:
                        self._copy_checkpoint(info.path, info.name)
                if local:
                    storage.write_text(storage.join(self.checkpoints_url, POINTER), local[0].name + "\n")
                self._prune({c.name for c in local})
                for name in MIRRORED:  # what a fresh runtime needs to continue, and the curves
                    if (self.run.path / name).exists():
                        storage.sync(str(self.run.path / name), storage.join(self.url, name), self.options)
                self.error = None
            except Exception as exc:
                self.error = f"{type(exc).__name__}: {exc}"
                log.warning("Mirroring checkpoints to %s failed (%s); training goes on and the mirror catches up "
                            "at the next checkpoint.", self.url, self.error)

    def _copy_checkpoint(self, path: str, name: str) -> None:
        remote = storage.join(self.checkpoints_url, name)
        names = sorted(os.listdir(path))
        if not storage.is_gcs_url(remote):  # Drive (a mounted folder): fail early, saying what to free
            size = sum(os.path.getsize(os.path.join(path, n)) for n in names)
            storage.ensure_free_space(self.checkpoints_url, size, what=f"checkpoint {name}")
        for file in [n for n in names if n != MANIFEST] + [MANIFEST]:
            storage.copy(os.path.join(path, file), storage.join(remote, file), self.options)
        self._mirrored.add(name)

    def _prune(self, keep: set[str]) -> None:
        for step in sorted(self._steps())[:-self.keep_max]:
            name = checkpoint_name(step)
            if name not in keep:
                storage.delete(storage.join(self.checkpoints_url, name), recursive=True)
                self._mirrored.discard(name)

    def wait(self, timeout: float | None = None, retry: bool = True) -> bool:
        """Block until the mirror holds every local checkpoint (one more try if the last failed)."""
        if self._pending is not None:
            concurrent.futures.wait([self._pending], timeout=timeout)
        if retry and self.error is not None:
            self.schedule()
            concurrent.futures.wait([self._pending], timeout=timeout)
        return self.error is None

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    # -- reading --------------------------------------------------------------------------------------
    def _steps(self) -> dict[int, set[str]]:
        """The mirrored checkpoints' steps and the files each holds."""
        steps: dict[int, set[str]] = {}
        for rel, _ in storage.list_files(self.checkpoints_url):
            parts = rel.replace("\\", "/").split("/")
            step = step_of(parts[0]) if len(parts) == 2 else None
            if step is not None:
                steps.setdefault(step, set()).add(parts[1])
        return steps

    def newest_step(self) -> int | None:
        """The newest complete checkpoint in the mirror (None when there is none or it cannot be listed)."""
        try:
            complete = [s for s, files in self._steps().items() if MANIFEST in files]
        except Exception as exc:
            log.warning("Cannot list the checkpoint mirror %s: %s", self.checkpoints_url, exc)
            return None
        return max(complete) if complete else None

    def holds(self, name: str) -> bool:
        """Whether the mirror holds the complete checkpoint ``name``."""
        return storage.exists(storage.join(self.checkpoints_url, name, MANIFEST))

    def fetch(self, name: str, destination: Path) -> None:
        storage.sync(storage.join(self.checkpoints_url, name), str(destination), self.options)
        self._mirrored.add(name)
        log.info("Fetched checkpoint %s from the mirror %s.", name, self.url)


def fetch_run(mirror: str, run_dir: str | os.PathLike, options: TransferOptions | None = None) -> bool:
    """Bring a run from its mirror to a new runtime's local folder: its run files and its newest complete
    checkpoint, so that ``train``, ``evaluate`` and ``export`` work there. False when the mirror holds no run."""
    if not storage.exists(storage.join(mirror, CONFIG)):
        return False
    run = RunFolder(run_dir)
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
