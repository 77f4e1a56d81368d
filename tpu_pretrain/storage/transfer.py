"""Copy files or folders between local disk (or Drive) and Cloud Storage, fast and verifiably.

A transfer first lists both sides and compares sizes and crc32c, so what is already identical is
skipped (a re-run after a dropped connection only sends what is missing), then moves the rest with a
pool of threads: parallel streams hide network latency, which dominates for many small files.
Each file is retried with exponential backoff on transient errors (resumable uploads continue where
the server stopped), verified by crc32c, and reported in a summary whose failures name the object
and the cause.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ..formatting import human_bytes
from . import checksums, drive, gcs, objects, sliced
from .errors import StorageError, explain, is_transient
from .local import LocalBackend

MiB = 1024 * 1024


@dataclass
class TransferOptions:
    """How a transfer runs; the defaults suit Colab/Kaggle to a bucket in the same region."""

    workers: int = 8
    retries: int = 5
    backoff: float = 1.0  # seconds before the first retry; doubles each time, capped at max_backoff
    max_backoff: float = 30.0
    chunk_size: int = 8 * MiB
    resumable_threshold: int = 8 * MiB
    parallel_threshold: int = 150 * MiB  # larger files move as parallel slices (composite upload, ranged download)
    slice_size: int = 32 * MiB
    progress: bool = True
    state_dir: str | None = None  # where resumable sessions are remembered (default: user cache)
    on_progress: Callable[[int], None] | None = None  # told the total bytes moved so far


@dataclass
class FileResult:
    source: str
    dest: str
    size: int
    status: str  # "sent", "skipped" or "failed"
    error: str | None = None
    bytes_sent: int = 0  # bytes that crossed the network (less than size after a resume)
    chunks: int = 0
    attempts: int = 0


@dataclass
class TransferSummary:
    source: str
    dest: str
    results: list[FileResult] = field(default_factory=list)
    seconds: float = 0.0

    def _with(self, status: str) -> list[FileResult]:
        return [r for r in self.results if r.status == status]

    @property
    def sent(self) -> list[FileResult]:
        return self._with("sent")

    @property
    def skipped(self) -> list[FileResult]:
        return self._with("skipped")

    @property
    def failed(self) -> list[FileResult]:
        return self._with("failed")

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def bytes_sent(self) -> int:
        return sum(r.bytes_sent for r in self.results)

    def text(self) -> str:
        moved = sum(r.size for r in self.sent)
        rate = moved / self.seconds if self.seconds > 0 else 0.0
        lines = [
            f"{self.source} -> {self.dest}: {len(self.sent)} sent ({human_bytes(moved)} in "
            f"{self.seconds:.1f} s, {human_bytes(rate)}/s), {len(self.skipped)} skipped (already "
            f"identical), {len(self.failed)} failed"
        ]
        lines += [f"  FAILED {r.error} ({r.attempts} attempt{'s' if r.attempts != 1 else ''})" for r in self.failed]
        return "\n".join(lines)

    def raise_for_failures(self) -> TransferSummary:
        if self.failed:
            raise StorageError(self.text())
        return self


@dataclass
class _Item:
    rel: str
    src: str
    dst: str
    size: int
    src_crc: str | None = None
    generation: int | None = None


def transfer(src: str, dst: str, options: TransferOptions | None = None) -> TransferSummary:
    """Copy a file or folder ``src`` to ``dst`` (either may be local or gs://), skipping identical files.

    A folder's contents go under ``dst``; a file goes to ``dst`` itself, or into it when ``dst`` ends
    with '/' or is an existing folder.
    """
    options = options or TransferOptions()
    src, dst = os.fspath(src), os.fspath(dst)
    for location in (src, dst):
        gcs.check_location(location)
    start = time.monotonic()
    items, single = _plan(src, dst)
    summary = TransferSummary(src, dst)
    todo = []
    for item, identical in zip(items, _identical(items, dst, single, options), strict=True):
        if identical:
            summary.results.append(FileResult(item.src, item.dst, item.size, "skipped"))
        else:
            todo.append(item)
    if todo and not gcs.is_gcs_url(dst):
        drive.ensure_free_space(os.path.dirname(todo[0].dst) or ".", sum(i.size for i in todo),
                                what=f"{len(todo)} file(s)")
    summary.results += _run(todo, options, label=_label(src, dst))
    summary.seconds = time.monotonic() - start
    return summary


def _label(src: str, dst: str) -> str:
    if gcs.is_gcs_url(dst) and not gcs.is_gcs_url(src):
        return "upload"
    if gcs.is_gcs_url(src) and not gcs.is_gcs_url(dst):
        return "download"
    return "copy"


# -- planning ------------------------------------------------------------------------------------
def _plan(src: str, dst: str) -> tuple[list[_Item], bool]:
    if gcs.is_gcs_url(src):
        backend = gcs.GcsBackend()
        infos = backend.list(src)
        single = not backend.is_dir(src)
        entries = [(i.rel, i.size, i.crc32c, i.generation) for i in infos]
        if not entries:
            raise StorageError(f"{src}: no objects under this prefix.")
    else:
        if not os.path.exists(src):
            raise StorageError(f"{src}: no such file or folder.")
        single = os.path.isfile(src)
        entries = [(rel, size, None, None) for rel, size in LocalBackend().list(src)]
    if single:
        rel, size, crc, gen = entries[0]
        target = _join(dst, rel) if _is_folder_target(dst) else dst
        return [_Item(rel, src, target, size, crc, gen)], True
    items = [_Item(rel, _join(src, rel), _join(dst, rel), size, crc, gen) for rel, size, crc, gen in entries]
    return items, False


def _is_folder_target(dst: str) -> bool:
    if dst.endswith("/"):
        return True
    if gcs.is_gcs_url(dst):
        path = gcs.GcsPath.parse(dst)
        return not path.name or (gcs.GcsBackend().exists(dst) and gcs.GcsBackend().is_dir(dst))
    return os.path.isdir(dst)


def _join(base: str, rel: str) -> str:
    if gcs.is_gcs_url(base):
        return gcs.GcsPath.parse(base).child(rel).url
    return os.path.join(base, *rel.split("/"))


def _identical(items: list[_Item], dst: str, single: bool, options: TransferOptions) -> list[bool]:
    """For each item, whether the destination already holds the same bytes (size and crc32c)."""
    if not items:
        return []
    if gcs.is_gcs_url(dst):
        backend = gcs.GcsBackend()
        if single:
            infos = backend.list(items[0].dst) if backend.exists(items[0].dst) else []
            existing = {items[0].dst: infos[0]} if len(infos) == 1 else {}
        else:
            root = gcs.GcsPath.parse(dst.rstrip("/") + "/")
            existing = {root.child(info.rel).url: info for info in backend.list(root.url)}

        def dest_crc(item: _Item) -> str | None:
            info = existing.get(item.dst)
            return info.crc32c if info is not None and info.size == item.size else None
    else:

        def dest_crc(item: _Item) -> str | None:
            if os.path.isfile(item.dst) and os.path.getsize(item.dst) == item.size:
                return checksums.crc32c_file(item.dst)
            return None

    def check(item: _Item) -> bool:
        if item.src_crc is None and not gcs.is_gcs_url(item.src):
            item.src_crc = checksums.crc32c_file(item.src)
        other = dest_crc(item)
        return other is not None and other == item.src_crc

    with ThreadPoolExecutor(max_workers=max(1, options.workers)) as pool:
        return list(pool.map(check, items))


# -- execution -----------------------------------------------------------------------------------
def _run(items: list[_Item], options: TransferOptions, label: str) -> list[FileResult]:
    if not items:
        return []
    from tqdm.auto import tqdm

    lock = threading.Lock()
    total = [0]
    bar = tqdm(total=sum(i.size for i in items), unit="B", unit_scale=True, unit_divisor=1024,
               desc=f"{label} {len(items)} file(s)", disable=not options.progress, dynamic_ncols=True)

    def tracker():
        last = [0]

        def on_position(pos: int) -> None:
            with lock:
                delta = pos - last[0]
                if delta <= 0:
                    return
                last[0] = pos
                total[0] += delta
                bar.update(delta)
                moved = total[0]
            if options.on_progress:
                options.on_progress(moved)

        return on_position

    def work(item: _Item) -> FileResult:
        result = FileResult(item.src, item.dst, item.size, "failed")
        on_position = tracker()
        for attempt in range(options.retries + 1):
            result.attempts = attempt + 1
            try:
                sent, chunks = _copy_one(item, options, on_position)
                result.bytes_sent += sent
                result.chunks += chunks
                result.status, result.error = "sent", None
                return result
            except Exception as exc:  # every failure is reported, none is swallowed silently
                err = exc if isinstance(exc, StorageError) else explain(exc, item.src, f"copy to {item.dst}")
                result.error = str(err)
                if attempt >= options.retries or not is_transient(err):
                    return result
                delay = min(options.max_backoff, options.backoff * 2 ** attempt) * random.uniform(0.5, 1.0)
                time.sleep(delay)
        return result

    try:
        with ThreadPoolExecutor(max_workers=max(1, options.workers)) as pool:
            return list(pool.map(work, items))
    finally:
        bar.close()


def _copy_one(item: _Item, options: TransferOptions, on_position) -> tuple[int, int]:
    """Copy one file; return (bytes sent over the network, chunks)."""
    src_gcs, dst_gcs = gcs.is_gcs_url(item.src), gcs.is_gcs_url(item.dst)
    if not src_gcs and dst_gcs:
        crc = item.src_crc or checksums.crc32c_file(item.src)
        size = os.path.getsize(item.src)
        if size != item.size:
            raise StorageError(f"{item.src}: the file changed size during the upload; run it again.")
        if size >= options.parallel_threshold and options.workers > 1:
            return sliced.composite_upload(item.src, gcs.GcsPath.parse(item.dst), crc, size, options.workers,
                                           options.slice_size, on_position)
        return objects.upload_file(item.src, gcs.GcsPath.parse(item.dst), crc, size, options.chunk_size,
                               options.resumable_threshold, options.state_dir, on_position)
    if src_gcs and not dst_gcs and item.size >= options.parallel_threshold and options.workers > 1:
        received = sliced.ranged_download(gcs.GcsPath.parse(item.src), item.dst, item.size, item.src_crc,
                                          item.generation, options.workers, options.slice_size, on_position)
        return received, 1
    if src_gcs and not dst_gcs:
        received = objects.download_file(gcs.GcsPath.parse(item.src), item.dst, item.size, item.src_crc,
                                     item.generation, on_position)
        return received, 1
    if src_gcs and dst_gcs:
        gcs.GcsBackend().copy_object(item.src, item.dst, item.generation)
        on_position(item.size)
        return 0, 1
    LocalBackend().copy_file(item.src, item.dst, on_bytes=_accumulate(on_position))
    return item.size, 1


def _accumulate(on_position):
    position = [0]

    def on_bytes(n: int) -> None:
        position[0] += n
        on_position(position[0])

    return on_bytes
