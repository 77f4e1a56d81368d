"""Checkpoints that survive disconnects: atomic local writes, a background mirror, verified restore.

A checkpoint is a folder ``checkpoints/ckpt-000001000/`` holding TensorFlow's files and a
``checkpoint.json`` that lists each file's size and CRC32C. It is written under a temporary name and
renamed when complete, and ``checkpoints/latest`` (the pointer) is written last, so a reader never
sees half a checkpoint. A copy is then mirrored to the run's Drive folder or Cloud Storage prefix in a
background thread (files first, ``checkpoint.json`` last), which keeps a slow or vanished network off
the training loop's path. On start, the newest checkpoint whose files match their recorded sizes and
checksums is restored, locally or from the mirror; a truncated or missing file makes it fall back to
the previous one, with a warning naming it.
"""

from __future__ import annotations

import concurrent.futures
import errno
import json
import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import storage
from .errors import UserInputError
from .storage.checksums import crc32c_file
from .storage.drive import SAFETY_MARGIN, human_bytes
from .storage.local import write_text_atomic

log = logging.getLogger(__name__)

PREFIX = "ckpt-"
MANIFEST = "checkpoint.json"
POINTER = "latest"
TF_PREFIX = "state"  # TensorFlow writes state.index and state.data-*
RUN_FILES = ("config.json", "run.json", "bert_config.json", "vocab.txt", "logs")  # mirrored beside checkpoints/


class CheckpointError(UserInputError):
    """A checkpoint cannot be written or used; the message names it and what to do."""


@dataclass
class CheckpointInfo:
    step: int
    path: str
    metadata: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return os.path.basename(self.path.rstrip("/"))

    @property
    def tf_prefix(self) -> str:
        return os.path.join(self.path, TF_PREFIX)


def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:09d}"


def _step_of(name: str) -> int | None:
    if not name.startswith(PREFIX):
        return None
    try:
        return int(name[len(PREFIX):])
    except ValueError:
        return None


def estimate_bytes(checkpoint) -> int:
    """Bytes the variables of a ``tf.train.Checkpoint`` take on disk, plus room for TensorFlow's index."""
    import tensorflow as tf

    variables = {id(v): v for v in tf.train.TrackableView(checkpoint).descendants() if isinstance(v, tf.Variable)}
    return sum(v.shape.num_elements() * v.dtype.size for v in variables.values()) + 64 * 1024


class CheckpointManager:
    """Saves, lists, prunes, mirrors and restores the checkpoints of one run folder."""

    def __init__(self, run_dir: str | os.PathLike, checkpoint, *, keep_max: int = 5, mirror: str | None = None,
                 safety_margin: int = SAFETY_MARGIN):
        self.directory = Path(run_dir) / "checkpoints"
        self.checkpoint = checkpoint
        self.keep_max = keep_max
        self.run_dir = Path(run_dir)
        self.run_mirror = mirror
        self.mirror = storage.join(mirror, "checkpoints") if mirror else None
        self.safety_margin = safety_margin
        self.mirror_error: str | None = None
        self._mirrored: set[str] = set()
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="mirror")
        self._pending: concurrent.futures.Future | None = None
        self._lock = threading.Lock()

    # -- writing ----------------------------------------------------------------------------------
    def save(self, step: int, metadata: dict | None = None) -> CheckpointInfo:
        """Write the checkpoint for ``step`` atomically, prune old ones, and start mirroring it."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self._remove_stale_temporaries()
        needed = estimate_bytes(self.checkpoint)
        free = shutil.disk_usage(self.directory).free
        if needed + self.safety_margin > free:
            raise CheckpointError(
                f"Not enough space to save the checkpoint for step {step} in {self.directory}: it needs about "
                f"{human_bytes(needed)} (+{human_bytes(self.safety_margin)} margin) but {human_bytes(free)} is free. "
                f"Free at least {human_bytes(needed + self.safety_margin - free)} (lower keep_checkpoint_max, delete "
                "old files) and start again: training resumes from the newest checkpoint, which is intact.")
        name = checkpoint_name(step)
        final = self.directory / name
        tmp = self.directory / f".{name}.tmp-{os.getpid()}"
        started = time.perf_counter()
        try:
            tmp.mkdir()
            self.checkpoint.write(str(tmp / TF_PREFIX))
            files = {}
            for path in sorted(tmp.iterdir()):
                files[path.name] = {"bytes": path.stat().st_size, "crc32c": crc32c_file(path)}
                _fsync(path)
            manifest = {"step": step, "time": time.time(), "files": files, "metadata": metadata or {}}
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
            _fsync(tmp / MANIFEST)
            if final.exists():  # the same step saved again after a resume: replace it
                shutil.rmtree(final)
            os.replace(tmp, final)
            _fsync_dir(self.directory)
            write_text_atomic(self.directory / POINTER, name + "\n")
        except Exception as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if _is_disk_full(exc):
                raise CheckpointError(
                    f"The disk under {self.directory} filled up while saving the checkpoint for step {step} "
                    f"({human_bytes(needed)} needed). The partial files were removed; the earlier checkpoints are "
                    "intact. Free space and start again to resume.") from None
            raise
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        log.info("Saved checkpoint %s (%s) in %.1f s.", final, human_bytes(needed), time.perf_counter() - started)
        self._prune()
        info = CheckpointInfo(step, str(final), manifest["metadata"])
        if self.mirror:
            self._pending = self._executor.submit(self._mirror_all)
        return info

    def _remove_stale_temporaries(self) -> None:
        for path in self.directory.glob(f".{PREFIX}*.tmp-*"):
            shutil.rmtree(path, ignore_errors=True)

    def _prune(self) -> None:
        names = sorted(p.name for p in self.directory.iterdir() if _step_of(p.name) is not None)
        for name in names[:-self.keep_max]:
            shutil.rmtree(self.directory / name, ignore_errors=True)

    # -- reading ----------------------------------------------------------------------------------
    def local_checkpoints(self) -> list[CheckpointInfo]:
        """Local checkpoints, newest first (not yet verified)."""
        if not self.directory.is_dir():
            return []
        found = []
        for path in self.directory.iterdir():
            step = _step_of(path.name)
            if step is not None and path.is_dir():
                found.append(CheckpointInfo(step, str(path)))
        return sorted(found, key=lambda c: -c.step)

    def verify(self, info: CheckpointInfo) -> str | None:
        """Why a local checkpoint is unusable (missing, truncated or corrupt file), or None if it is whole."""
        manifest_path = Path(info.path) / MANIFEST
        try:
            manifest = json.loads(manifest_path.read_text())
        except (OSError, json.JSONDecodeError):
            return f"{manifest_path} is missing or unreadable"
        for name, expected in manifest["files"].items():
            path = Path(info.path) / name
            if not path.is_file():
                return f"{path} is missing"
            if path.stat().st_size != expected["bytes"]:
                return f"{path} has {path.stat().st_size} bytes, {expected['bytes']} were written"
            if crc32c_file(path) != expected["crc32c"]:
                return f"{path} does not match its CRC32C"
        info.metadata = manifest.get("metadata", {})
        return None

    def newest_valid(self) -> CheckpointInfo | None:
        """The newest whole checkpoint, fetching it from the mirror when the mirror's is newer."""
        local = self.local_checkpoints()
        remote_step = self._newest_mirrored_step()
        if remote_step is not None and (not local or remote_step > local[0].step):
            try:
                self._download(remote_step)
                local = self.local_checkpoints()
            except Exception as exc:  # the mirror is a fallback: a failure here is not fatal
                log.warning("Could not fetch checkpoint %s from %s: %s", checkpoint_name(remote_step), self.mirror,
                            exc)
        for info in local:
            problem = self.verify(info)
            if problem is None:
                return info
            log.warning("Skipping checkpoint %s: %s. Falling back to an earlier one.", info.path, problem)
        return None

    def restore_latest(self) -> CheckpointInfo | None:
        """Restore the newest whole checkpoint into the tracked objects; None when there is none."""
        while True:
            info = self.newest_valid()
            if info is None:
                return None
            try:
                self.checkpoint.read(info.tf_prefix).assert_existing_objects_matched()
                return info
            except (ValueError, AssertionError) as exc:
                raise CheckpointError(
                    f"Checkpoint {info.path} does not fit the model being built ({str(exc).splitlines()[0]}). "
                    "The run's configuration changed in a way that changes the model; use a new output_dir."
                ) from None
            except Exception as exc:  # unreadable despite matching checksums: fall back
                log.warning("Skipping checkpoint %s: TensorFlow cannot read it (%s).", info.path, exc)
                shutil.rmtree(info.path, ignore_errors=True)

    # -- mirror -----------------------------------------------------------------------------------
    def _mirror_all(self) -> None:
        """Copy every complete local checkpoint the mirror lacks (files first, manifest last), then prune."""
        with self._lock:
            try:
                for info in sorted(self.local_checkpoints(), key=lambda c: c.step):
                    if info.name in self._mirrored:
                        continue
                    remote = storage.join(self.mirror, info.name)
                    names = sorted(os.listdir(info.path))
                    if not storage.is_gcs_url(remote):  # Drive (a mounted folder): fail early, saying what to free
                        size = sum(os.path.getsize(os.path.join(info.path, n)) for n in names)
                        storage.ensure_free_space(self.mirror, size, what=f"checkpoint {info.name}")
                    for name in [n for n in names if n != MANIFEST] + [MANIFEST]:
                        storage.copy(os.path.join(info.path, name), storage.join(remote, name))
                    self._mirrored.add(info.name)
                newest = self.local_checkpoints()
                if newest:
                    storage.write_text(storage.join(self.mirror, POINTER), newest[0].name + "\n")
                self._prune_mirror()
                for name in RUN_FILES:  # what a fresh runtime needs to continue, and the curves
                    if (self.run_dir / name).exists():
                        storage.sync(str(self.run_dir / name), storage.join(self.run_mirror, name))
                self.mirror_error = None
            except Exception as exc:
                self.mirror_error = f"{type(exc).__name__}: {exc}"
                log.warning("Mirroring checkpoints to %s failed (%s); training goes on and the mirror catches up "
                            "at the next checkpoint.", self.mirror, self.mirror_error)

    def _mirror_steps(self) -> dict[int, set[str]]:
        steps: dict[int, set[str]] = {}
        for rel, _ in storage.list_files(self.mirror):
            parts = rel.replace("\\", "/").split("/")
            step = _step_of(parts[0]) if len(parts) == 2 else None
            if step is not None:
                steps.setdefault(step, set()).add(parts[1])
        return steps

    def _newest_mirrored_step(self) -> int | None:
        if not self.mirror:
            return None
        try:
            complete = [s for s, files in self._mirror_steps().items() if MANIFEST in files]
        except Exception as exc:
            log.warning("Cannot list the checkpoint mirror %s: %s", self.mirror, exc)
            return None
        return max(complete) if complete else None

    def _download(self, step: int) -> None:
        name = checkpoint_name(step)
        tmp = self.directory / f".{name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        storage.sync(storage.join(self.mirror, name), str(tmp))
        os.replace(tmp, self.directory / name)
        self._mirrored.add(name)
        log.info("Fetched checkpoint %s from the mirror %s.", name, self.mirror)

    def _prune_mirror(self) -> None:
        keep = {c.name for c in self.local_checkpoints()}
        steps = self._mirror_steps()
        for step in sorted(steps)[:-self.keep_max]:
            if checkpoint_name(step) not in keep:
                storage.delete(storage.join(self.mirror, checkpoint_name(step)), recursive=True)
                self._mirrored.discard(checkpoint_name(step))

    def wait_for_mirror(self, timeout: float | None = None, retry: bool = True) -> bool:
        """Block until the mirror holds every local checkpoint (one more try if the last failed)."""
        if not self.mirror:
            return True
        if self._pending is not None:
            concurrent.futures.wait([self._pending], timeout=timeout)
        if retry and self.mirror_error is not None:
            self._pending = self._executor.submit(self._mirror_all)
            concurrent.futures.wait([self._pending], timeout=timeout)
        return self.mirror_error is None

    def close(self) -> None:
        self._executor.shutdown(wait=True)


def fetch_run(mirror: str, run_dir: str | os.PathLike) -> bool:
    """Bring a run's files (not its checkpoints: the manager fetches the newest) from its mirror to a new
    runtime's local folder, so that ``train`` there continues it. False when the mirror holds no run."""
    if not storage.exists(storage.join(mirror, "config.json")):
        return False
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    for name in RUN_FILES:
        remote = storage.join(mirror, name)
        if storage.exists(remote):
            storage.sync(remote, os.path.join(run_dir, name))
    return True


def find_checkpoint(run_dir: str | os.PathLike, step: int | None = None) -> CheckpointInfo:
    """A whole checkpoint of a run folder: the newest, or the one at ``step`` (for evaluate and export)."""
    directory = Path(run_dir) / "checkpoints"
    manager = CheckpointManager(run_dir, checkpoint=None)
    candidates = [c for c in manager.local_checkpoints() if step is None or c.step == step]
    for info in candidates:
        problem = manager.verify(info)
        if problem is None:
            return info
        log.warning("Skipping checkpoint %s: %s.", info.path, problem)
    which = f"at step {step}" if step is not None else "that is whole"
    raise CheckpointError(f"No checkpoint {which} in {directory}.")


def _is_disk_full(exc: BaseException) -> bool:
    """ENOSPC/EDQUOT from Python, or TensorFlow's ResourceExhaustedError for the same condition."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return "No space left on device" in str(exc) or "Disk quota exceeded" in str(exc)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    try:
        _fsync(path)
    except OSError:  # pragma: no cover - some filesystems (Drive's FUSE) refuse directory fsync
        pass
