"""Training batches placed on the devices ahead of the steps by a background thread, so input overlaps compute.

While the devices run one compiled call, a thread pulls the next batches from the input (which reads and
decodes them in its own threads), places each on the devices split over the replicas, and queues it; the
trainer stacks a call's batches on the devices (:func:`chunk_stacker`: a copy there, small beside a step).
The queue holds single batches, not whole calls, because a call's length is known only when the loop asks
for it (whole ``steps_per_execution`` calls, shorter ones up to a boundary): any sequence of lengths takes
the batches in the input's own order, so the order stays a pure function of (seed, records consumed) and
exact resume holds. ``depth`` 0 runs no thread: batches are pulled and placed when asked for (the serial
baseline of ``benchmarks/bench_input_overlap.py``). ``wait_seconds`` counts the time the caller waited for
batches that were not ready yet; an error of the input (a corrupt shard) is raised in the caller as it was.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator

import jax
import jax.numpy as jnp

THREAD_NAME = "input-prefetch"
_POLL_SECONDS = 0.05


class _End:
    """What the thread queues after the input's last batch, or after its error (``error``)."""

    def __init__(self, error: BaseException | None = None):
        self.error = error


class BatchPrefetcher:
    """``(example ids, batch placed on the devices)`` pulled from ``source`` up to ``depth`` batches ahead."""

    def __init__(self, source: Iterator, place: Callable[[dict], dict], depth: int):
        self.source, self.depth, self._place = source, depth, place
        self.wait_seconds = 0.0
        self._end: _End | None = None
        self._stop = threading.Event()
        self._queue: queue.Queue = queue.Queue(maxsize=max(depth, 1))
        self._thread = None
        if depth:
            self._thread = threading.Thread(target=self._fill, name=THREAD_NAME, daemon=True)
            self._thread.start()

    @property
    def queued(self) -> int:
        """Batches placed on the devices and waiting to be taken."""
        return self._queue.qsize()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _produce(self) -> tuple:
        ids, batch = next(self.source)
        return ids, self._place(batch)

    def _fill(self) -> None:
        """The thread: produce and queue until stopped, the input ends, or it fails (the error is queued)."""
        while not self._stop.is_set():
            try:
                item = self._produce()
            except StopIteration:
                item = _End()
            except Exception as error:  # noqa: BLE001 - handed to the caller, raised there
                item = _End(error)
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=_POLL_SECONDS)
                    break
                except queue.Full:
                    continue
            if isinstance(item, _End):
                return

    def _ready(self):
        """The next queued item, or None when the caller would have to wait for it."""
        if self._thread is None:
            return None
        try:
            return self._queue.get_nowait()
        except queue.Empty:
            return None

    def _wait(self):
        if self._thread is None:
            try:
                return self._produce()
            except StopIteration:
                return _End()
        while True:
            try:
                return self._queue.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    raise RuntimeError("The input prefetch thread stopped (the input was closed).") from None

    def take(self, n: int, idle: Callable[[], object] | None = None) -> list[tuple]:
        """The next ``n`` ``(ids, placed batch)``. Before the first wait, ``idle()`` is called (the trainer lets the
        devices finish there), so ``wait_seconds`` counts only time the devices had nothing to do but wait."""
        items = []
        for _ in range(n):
            item = self._end or self._ready()
            if item is None:
                if idle is not None:
                    idle()
                    idle = None
                start = time.perf_counter()
                item = self._wait()
                self.wait_seconds += time.perf_counter() - start
            if isinstance(item, _End):
                self._end = item
                if item.error is not None:
                    raise item.error
                raise StopIteration
            items.append(item)
        return items

    def close(self) -> None:
        """Stop the thread (it ends within a batch) and drop what it queued."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        while not self._queue.empty():
            self._queue.get_nowait()


def chunk_stacker(sharding, replicated, length: int) -> Callable[[tuple], tuple]:
    """Batches placed one by one -> one call's input on the devices: ``[length, batch, ...]`` with ``sharding`` (the
    last batch repeated past the ones given, never trained on) and the count given, a replicated int32 that the
    compiled call loops to, so every call has one shape."""
    def stack(batches):
        padded = tuple(batches) + (batches[-1],) * (length - len(batches))
        return jax.tree.map(lambda *xs: jnp.stack(xs), *padded), jnp.int32(len(batches))

    return jax.jit(stack, out_shardings=(sharding, replicated))
