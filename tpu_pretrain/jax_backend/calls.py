"""A call of training steps the JAX trainer dispatched (:meth:`.trainer.JaxTrainer.dispatch`): its statistics stay on
the devices, so the host goes on (reading the last call's figures, placing the next call's batches) until the loop
reads them; whether dispatching it compiled; and when the devices finished it."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable

import jax

from ..core.metrics import metrics_from_sums


def cache_size(jitted) -> int | None:
    """How many compiled versions a jitted function holds: a dispatch that grew it compiled one (None where this
    JAX does not say; the trainer then counts its first call as the compile)."""
    count = getattr(jitted, "_cache_size", None)
    return count() if callable(count) else None


class CompletionClock:
    """The moment the devices finished a call, taken by a thread that waits for its outputs.

    The loop reads a call's figures only after dispatching the next, and on a GPU dispatching a call whose trip count
    XLA does not know (a call cut short by a boundary) holds the host until about its last step is queued (XLA's while
    loop reads its condition on the host), so the time a call is read can be a whole call after it finished: timed by
    its reading, the first steady call of an H100 run looked twice as fast as it was. Timed here, every call counts
    from the end of the one before.
    """

    def __init__(self, outputs):
        self._done, self._at = threading.Event(), 0.0
        threading.Thread(target=self._wait, args=(outputs,), name="call-completion", daemon=True).start()

    def _wait(self, outputs) -> None:
        try:
            jax.block_until_ready(outputs)
        except Exception:  # noqa: BLE001, S110 - a failed call is timed too: reading it raises the error
            pass
        self._at = time.perf_counter()
        self._done.set()

    def at(self) -> float:
        self._done.wait()
        return self._at


@dataclasses.dataclass
class PendingCall:
    """A dispatched call (:meth:`.trainer.JaxTrainer.dispatch`): its statistics stay on the devices until read."""

    read: Callable[[PendingCall], dict]
    sums: dict
    steps: int
    last: int  # the step it ends at
    input_wait_seconds: float
    compile_seconds: float  # the dispatch's compile of the call (0: it was compiled before)
    clock: CompletionClock  # when the devices finish it

    def finished_at(self) -> float:
        """When the devices finished the call (``time.perf_counter``); waits for it."""
        return self.clock.at()

    def totals(self) -> dict:
        return self.read(self)

    def result(self) -> dict:
        """The call's mean metrics and its input wait; waits for the devices to finish it."""
        return {**metrics_from_sums(self.totals()), "input_wait_seconds": self.input_wait_seconds}
