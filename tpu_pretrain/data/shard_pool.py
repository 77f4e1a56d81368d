"""Worker processes that write shards, watched: a worker that dies or cannot start stops create-data at once.

Why not ``multiprocessing.Pool``: a worker killed mid-task (the kernel's out-of-memory killer sends SIGKILL) takes
its task with it and the pool starts another process, so the parent waits for that result forever, saying
nothing; a worker whose start fails is replaced again and again, a traceback each. Here each worker marks which
task it holds in memory the parent shares (a message could be lost: a queue sends from a thread of the worker, which
a SIGKILL ends with what it had not sent yet), the parent watches the processes, and a death or a failed start ends
the command within a second, naming the task and the likely cause, the finished shards kept.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import pickle
import queue
import signal
import threading
import traceback
from collections.abc import Callable, Iterable, Iterator

POLL_SECONDS = 0.2
IDLE = -1  # a worker's mark between tasks


class WorkerDied(RuntimeError):
    """A worker process ended without finishing its task; ``task`` is None when it was between tasks."""

    def __init__(self, task, exitcode: int):
        self.task, self.exitcode = task, exitcode
        super().__init__(f"a worker process {how_it_ended(exitcode)}")


class RemoteTraceback(Exception):
    """The worker's traceback, attached as the cause of the error it raised."""

    def __str__(self) -> str:
        return str(self.args[0])


def how_it_ended(exitcode: int) -> str:
    if exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


class ShardPool:
    """``workers`` spawned processes, each running ``initializer(*initargs)`` once, then tasks one at a time."""

    def __init__(self, workers: int, initializer: Callable, initargs: tuple = ()):
        context = multiprocessing.get_context("spawn")
        self._tasks, self._results = context.Queue(), context.Queue()
        self._held = context.Array("i", [IDLE] * workers, lock=False)  # worker i's task number, IDLE between tasks
        with _ctrl_c_ignored():  # inherited by the workers from their first instruction: Ctrl-C is the parent's
            self._processes = [context.Process(target=_serve, args=(initializer, initargs, self._tasks, self._results,
                                                                    self._held, index), daemon=True)
                               for index in range(workers)]
            for process in self._processes:
                process.start()

    def __enter__(self) -> ShardPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def imap_unordered(self, function: Callable, items: Iterable) -> Iterator:
        """``function(item)`` for every item, in the workers, as each finishes; a worker's error is raised here,
        and :class:`WorkerDied` when a worker ends without finishing."""
        items = list(items)
        for number, item in enumerate(items):
            self._tasks.put((number, function, item))
        remaining = set(range(len(items)))
        while remaining:
            self._check_alive(items)  # a dead worker stops the command, whether or not it held a task
            try:
                message = self._results.get(timeout=POLL_SECONDS)
            except queue.Empty:
                continue
            number, value = self._receive(message)
            remaining.discard(number)
            yield value
        for _ in self._processes:
            self._tasks.put(None)

    @staticmethod
    def _receive(message: tuple) -> tuple[int, object]:
        """A finished task's (number, result); a task's error raised here."""
        kind, *rest = message
        if kind == "failed":
            raise _rebuilt(*rest)
        return rest[0], rest[1]

    def _check_alive(self, items: list) -> None:
        dead = [index for index, p in enumerate(self._processes) if p.exitcode is not None]
        if not dead:
            return
        with contextlib.suppress(queue.Empty):  # what it said before it ended (a failure, a finished task)
            while True:
                self._receive(self._results.get(timeout=POLL_SECONDS))
        number = self._held[dead[0]]
        raise WorkerDied(None if number == IDLE else items[number], self._processes[dead[0]].exitcode)

    def close(self) -> None:
        """Stop the workers (at once: a finished command has told them to end already)."""
        for process in self._processes:
            if process.is_alive():
                process.terminate()
        for process in self._processes:
            process.join(timeout=10)
        for channel in (self._tasks, self._results):
            channel.close()
            channel.cancel_join_thread()


def _serve(initializer: Callable, initargs: tuple, tasks, results, held, index: int) -> None:
    """Worker ``index``: start, then run tasks until told to end, marking in ``held`` the one it holds; an error goes
    back to the parent, pickled here (an error that cannot be pickled goes back as its text)."""
    try:
        initializer(*initargs)
    except BaseException as exc:  # noqa: BLE001 - whatever it is, the parent says it and stops
        results.put(("failed", *_portable(exc)))
        return
    while (item := tasks.get()) is not None:
        number, function, task = item
        held[index] = number
        try:
            value = function(task)
        except BaseException as exc:  # noqa: BLE001
            results.put(("failed", *_portable(exc)))
        else:
            held[index] = IDLE
            results.put(("done", number, value))


def _portable(exc: BaseException) -> tuple[bytes, str]:
    text = "".join(traceback.format_exception(exc))
    try:
        return pickle.dumps(exc), text
    except Exception:  # an error holding something unpicklable: its text is what matters
        return pickle.dumps(RuntimeError(f"{type(exc).__name__}: {exc}")), text


def _rebuilt(pickled: bytes, text: str) -> BaseException:
    exc = pickle.loads(pickled)
    exc.__cause__ = RemoteTraceback(text)
    return exc


@contextlib.contextmanager
def _ctrl_c_ignored():
    """SIGINT ignored while worker processes start (they keep that; the parent handles Ctrl-C and stops them)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
