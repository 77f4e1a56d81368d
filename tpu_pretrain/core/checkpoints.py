"""Checkpoints that survive disconnects: atomic local writes, verified restore, pruning.

A checkpoint is a folder ``checkpoints/ckpt-000001000/`` holding a backend's state files (TensorFlow's
``state.index``/``state.data-*``, or the JAX backend's ``state.npz``: a :class:`CheckpointState` writes
and reads them) and a ``checkpoint.json`` that lists each file's size and CRC32C. It is written under a
temporary name and renamed when complete, and ``checkpoints/latest`` (the pointer) is written last, so a
reader never sees half a checkpoint. On start, the newest checkpoint whose files match their recorded sizes and
checksums is restored (fetched from the mirror first when the mirror's is newer: see :mod:`.mirror`).
A damaged checkpoint (a truncated, missing or altered file) is never overwritten or pruned: when an
older whole one exists, training falls back to it and the damaged ones are moved to
``checkpoints/damaged/`` with a warning; when none is whole, training refuses to start and names them,
unless told to set them aside and start over.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ..errors import UserInputError
from ..formatting import human_bytes
from ..storage import drive
from ..storage.checksums import crc32c_file
from ..storage.drive import free_space
from ..storage.local import write_text_atomic

log = logging.getLogger(__name__)

PREFIX = "ckpt-"
MANIFEST = "checkpoint.json"
POINTER = "latest"
TF_PREFIX = "state"  # TensorFlow writes state.index and state.data-*
DAMAGED = "damaged"  # where damaged checkpoints are moved: kept for the user, never pruned or overwritten
DAMAGE_NOTE = "DAMAGED.txt"


class CheckpointError(UserInputError):
    """A checkpoint cannot be written or used; the message names it and what to do."""


class DamagedCheckpointsError(CheckpointError):
    """Every checkpoint of a run is damaged: training refuses to start over them."""

    def __init__(self, directory: Path, damaged: list[tuple[CheckpointInfo, str]]):
        listed = "; ".join(f"{info.name}: {why}" for info, why in damaged[:5])
        super().__init__(
            f"Every checkpoint in {directory} is damaged ({listed}), so there is nothing to resume from, and "
            "nothing was changed. Restore them from a copy (the mirror, a backup) to resume; or move them away "
            "yourself; or run again with --set_aside_damaged_checkpoints (Python: "
            f"train(..., set_aside_damaged_checkpoints=True)) to move them to {directory / DAMAGED} and start "
            "from step 0.")


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


class CheckpointState(Protocol):
    """What a backend checkpoints: its files written into a folder, read back, and their size beforehand.

    ``read`` raises ValueError when the files do not fit the model being built, any other exception
    when they cannot be read at all.
    """

    def write(self, folder: Path) -> None: ...

    def read(self, folder: Path) -> None: ...

    def estimated_bytes(self) -> int: ...



class Mirror(Protocol):
    """Where checkpoints are copied in the background (:class:`.mirror.CheckpointMirror`)."""

    def schedule(self, step: int | None = None) -> None: ...

    def newest_step(self) -> int | None: ...

    def fetch(self, name: str, destination: Path) -> None: ...


def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:09d}"


def step_of(name: str) -> int | None:
    """The step of a checkpoint folder's name, or None for anything else."""
    if not name.startswith(PREFIX):
        return None
    try:
        return int(name[len(PREFIX):])
    except ValueError:
        return None


def list_checkpoints(directory: str | os.PathLike) -> list[CheckpointInfo]:
    """The checkpoint folders in ``directory``, newest first (not yet verified)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [CheckpointInfo(step, str(path)) for path in directory.iterdir()
             if (step := step_of(path.name)) is not None and path.is_dir()]
    return sorted(found, key=lambda c: -c.step)


def verify(info: CheckpointInfo) -> str | None:
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


def find_checkpoint(directory: str | os.PathLike, step: int | None = None) -> CheckpointInfo:
    """A whole checkpoint in ``directory``: the newest, or the one at ``step`` (for evaluate and export)."""
    for info in list_checkpoints(directory):
        if step is not None and info.step != step:
            continue
        problem = verify(info)
        if problem is None:
            return info
        log.warning("Skipping checkpoint %s: %s.", info.path, problem)
    which = f"at step {step}" if step is not None else "that is whole"
    raise CheckpointError(f"No checkpoint {which} in {directory}.")



class CheckpointManager:
    """Saves, lists, prunes and restores the checkpoints in one folder; a mirror copies them away."""

    def __init__(self, directory: str | os.PathLike, checkpoint, *, keep_max: int = 5, mirror: Mirror | None = None,
                 safety_margin: int | None = None):
        """``checkpoint``: the backend's :class:`CheckpointState` (None to only list, verify and fetch)."""
        self.directory = Path(directory)
        self.checkpoint = checkpoint
        self.keep_max = keep_max
        self.mirror = mirror
        self.safety_margin = drive.margin_for(self.directory) if safety_margin is None else safety_margin

    # -- writing ----------------------------------------------------------------------------------
    def save(self, step: int, metadata: dict | None = None) -> CheckpointInfo:
        """Write the checkpoint for ``step`` atomically, prune old ones, and start mirroring it."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self._remove_stale_temporaries()
        needed = self.checkpoint.estimated_bytes()
        self._check_space(step, needed)
        name = checkpoint_name(step)
        final = self.directory / name
        tmp = self.directory / f".{name}.tmp-{os.getpid()}"
        started = time.perf_counter()
        try:
            manifest = self._write(tmp, step, metadata or {})
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
        if self.mirror is not None:
            self.mirror.schedule(step)
        return CheckpointInfo(step, str(final), manifest["metadata"])

    def _check_space(self, step: int, needed: int) -> None:
        free = free_space(self.directory)  # Kaggle's /kaggle/working: what its 20 GB leave
        if free is not None and needed + self.safety_margin > free:
            raise CheckpointError(
                f"Not enough space to save the checkpoint for step {step} in {self.directory}: it needs about "
                f"{human_bytes(needed)} (+{human_bytes(self.safety_margin)} margin) but {human_bytes(free)} is free. "
                f"Free at least {human_bytes(needed + self.safety_margin - free)} (lower keep_checkpoint_max, delete "
                "other files) and start again: training resumes from the newest checkpoint, which is intact.")

    def _write(self, folder: Path, step: int, metadata: dict) -> dict:
        """The backend's files, then the manifest of their sizes and checksums, each synced to disk."""
        folder.mkdir()
        self.checkpoint.write(folder)
        files = {}
        for path in sorted(folder.iterdir()):
            files[path.name] = {"bytes": path.stat().st_size, "crc32c": crc32c_file(path)}
            _fsync(path)
        manifest = {"step": step, "time": time.time(), "files": files, "metadata": metadata}
        (folder / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        _fsync(folder / MANIFEST)
        return manifest

    def _remove_stale_temporaries(self) -> None:
        for path in self.directory.glob(f".{PREFIX}*.tmp-*"):
            shutil.rmtree(path, ignore_errors=True)

    def _prune(self) -> None:
        names = sorted(p.name for p in self.directory.iterdir() if step_of(p.name) is not None)
        copying = getattr(self.mirror, "copying", None)  # the durable copy is reading it
        for name in [n for n in names[:-self.keep_max] if n != copying]:
            manifest = self.directory / name / MANIFEST
            if drive.is_drive_path(self.directory) and manifest.is_file():  # for good, not into Drive's bin
                written = {n: f["bytes"] for n, f in json.loads(manifest.read_text())["files"].items()}
                drive.remove_written(str(self.directory / name), {**written, MANIFEST: manifest.stat().st_size})
            else:
                shutil.rmtree(self.directory / name, ignore_errors=True)

    # -- reading ----------------------------------------------------------------------------------
    def local_checkpoints(self) -> list[CheckpointInfo]:
        """Local checkpoints, newest first (not yet verified)."""
        return list_checkpoints(self.directory)

    def scan(self) -> tuple[list[CheckpointInfo], list[tuple[CheckpointInfo, str]]]:
        """The whole local checkpoints and the damaged ones with why, newest first; a newer checkpoint in
        the mirror is fetched first."""
        local = self.local_checkpoints()
        remote_step = self.mirror.newest_step() if self.mirror is not None else None
        if remote_step is not None and (not local or remote_step > local[0].step):
            self._fetch(remote_step)
            local = self.local_checkpoints()
        whole, damaged = [], []
        for info in local:
            problem = verify(info)
            if problem is None:
                whole.append(info)
            else:
                damaged.append((info, problem))
        return whole, damaged

    def newest_valid(self) -> CheckpointInfo | None:
        """The newest whole checkpoint, fetching it from the mirror when the mirror's is newer."""
        whole, _ = self.scan()
        return whole[0] if whole else None

    def _fetch(self, step: int) -> None:
        name = checkpoint_name(step)
        tmp = self.directory / f".{name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            self.mirror.fetch(name, tmp)
            os.replace(tmp, self.directory / name)
        except Exception as exc:  # the mirror is a fallback: a failure here is not fatal
            shutil.rmtree(tmp, ignore_errors=True)
            log.warning("Could not fetch checkpoint %s from the mirror: %s", name, exc)

    def restore_latest(self, set_aside_damaged: bool = False) -> CheckpointInfo | None:
        """Restore the newest whole checkpoint into the tracked objects; None when there is none.

        Damaged checkpoints are moved to ``damaged/`` when a whole one is restored (or when
        ``set_aside_damaged``); when every checkpoint is damaged, :class:`DamagedCheckpointsError`.
        """
        whole, damaged = self.scan()
        restored = None
        for info in whole:
            try:
                self.checkpoint.read(Path(info.path))
            except ValueError as exc:
                raise CheckpointError(
                    f"Checkpoint {info.path} does not fit the model being built ({str(exc).splitlines()[0]}). "
                    "The run's configuration changed in a way that changes the model; use a new output_dir."
                ) from None
            except Exception as exc:  # unreadable despite matching checksums
                damaged.append((info, f"it cannot be read ({str(exc).splitlines()[0]})"))
                continue
            restored = info
            break
        if damaged and restored is None and not set_aside_damaged:
            raise DamagedCheckpointsError(self.directory, damaged)
        for info, why in damaged:
            self._set_aside(info, why)
        return restored

    def _set_aside(self, info: CheckpointInfo, why: str) -> None:
        """Move a damaged checkpoint to ``damaged/`` (with a note saying why): kept, out of every later save's way."""
        folder = self.directory / DAMAGED
        folder.mkdir(exist_ok=True)
        target = folder / info.name
        if target.exists():
            target = folder / f"{info.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        os.replace(info.path, target)
        (target / DAMAGE_NOTE).write_text(f"{why}\n")
        log.warning("Checkpoint %s is damaged (%s): moved to %s, where it stays.", info.name, why, target)


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

class FollowerCheckpoints:
    """A non-chief worker's checkpoints: restored from the chief's folder, saved into a scratch folder that is
    deleted at once (the save is collective; the chief's copy is the one kept)."""

    def __init__(self, chief_directory: Path, state: CheckpointState):
        self.chief = CheckpointManager(chief_directory, state)
        self.state = state

    def restore_latest(self, set_aside_damaged: bool = False) -> CheckpointInfo | None:
        newest = self.chief.newest_valid()
        if newest is None:
            return None
        self.state.read(Path(newest.path))
        return newest

    def save(self, step: int, metadata: dict | None = None) -> None:
        scratch = tempfile.mkdtemp(prefix="tpu_pretrain_worker_")
        try:
            self.state.write(Path(scratch))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def local_checkpoints(self) -> list[CheckpointInfo]:
        return self.chief.local_checkpoints()
