"""Session awareness: stop cleanly, with a last checkpoint, before the runtime is taken away.

Free Colab sessions end after at most 12 hours, Kaggle TPU sessions after 9, and a preemptible VM
is told to stop with SIGTERM. :class:`SessionGuard` turns the deadline and SIGTERM/SIGINT into one
question the training loop asks between steps: "should I save and stop now?". Checkpoint-and-resume
is what makes a disconnect harmless.
"""

from __future__ import annotations

import logging
import os
import signal
import time

from ..runtime import COLAB, KAGGLE, runtime

log = logging.getLogger(__name__)

SESSION_HOURS = {COLAB: 12.0, KAGGLE: 9.0}


def runtime_started_at() -> float:
    """When this runtime started (the container's first process on Colab/Kaggle), else this process.

    ``TPU_PRETRAIN_RUNTIME_STARTED`` (seconds since the epoch) says it instead, for a simulated Colab or Kaggle
    runtime on a machine whose first process is older than a session (the notebook tests)."""
    import psutil

    stated = os.environ.get("TPU_PRETRAIN_RUNTIME_STARTED", "").strip()
    if stated:
        return float(stated)
    if runtime() in SESSION_HOURS:
        try:
            return psutil.Process(1).create_time()
        except (psutil.Error, OSError):  # pragma: no cover - no access to PID 1
            pass
    return psutil.Process(os.getpid()).create_time()


def session_deadline(session_hours: float = 0.0) -> float | None:
    """Wall-clock time the session ends: ``session_hours`` (>0), the platform's limit (0), or none (<0)."""
    if session_hours < 0:
        return None
    hours = session_hours or SESSION_HOURS.get(runtime())
    if not hours:
        return None
    start = runtime_started_at() if not session_hours else time.time()
    return start + hours * 3600.0


class SessionGuard:
    """Answers "stop now?" for the deadline (minus a margin for the last save) and for SIGTERM/SIGINT."""

    def __init__(self, deadline: float | None, margin_seconds: float = 600.0, handle_signals: bool = True):
        self.deadline = deadline
        self.margin_seconds = margin_seconds
        self.reason: str | None = None
        self._previous: dict[int, object] = {}
        if handle_signals:
            self._install()

    def _install(self) -> None:
        import threading

        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.reason and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop at once
        self.reason = f"{name} received"
        log.warning("%s: saving a checkpoint and stopping after the current steps (Ctrl-C again to abort).", name)

    def seconds_left(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.time()

    def should_stop(self, next_chunk_seconds: float = 0.0) -> str | None:
        """Why training must stop now, or None. Counts the time the next chunk of steps would take."""
        if self.reason:
            return self.reason
        left = self.seconds_left()
        if left is not None and left < self.margin_seconds + next_chunk_seconds:
            self.reason = (f"the session ends in {left / 60:.0f} min (deadline minus the "
                           f"{self.margin_seconds:.0f} s margin)")
        return self.reason

    def close(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
