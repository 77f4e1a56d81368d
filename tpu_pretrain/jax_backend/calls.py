"""A call of training steps the JAX trainer dispatched (:meth:`.trainer.JaxTrainer.dispatch`): its statistics stay on
the devices, so the host goes on (reading the last call's figures, placing the next call's batches) until the loop
reads them; and whether dispatching it compiled."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ..core.metrics import metrics_from_sums


def cache_size(jitted) -> int | None:
    """How many compiled versions a jitted function holds: a dispatch that grew it compiled one (None where this
    JAX does not say; the trainer then counts its first call as the compile)."""
    count = getattr(jitted, "_cache_size", None)
    return count() if callable(count) else None


@dataclasses.dataclass
class PendingCall:
    """A dispatched call (:meth:`.trainer.JaxTrainer.dispatch`): its statistics stay on the devices until read."""

    read: Callable[[PendingCall], dict]
    sums: dict
    steps: int
    last: int  # the step it ends at
    input_wait_seconds: float
    compile_seconds: float  # the dispatch's compile of the call (0: it was compiled before)

    def totals(self) -> dict:
        return self.read(self)

    def result(self) -> dict:
        """The call's mean metrics and its input wait; waits for the devices to finish it."""
        return {**metrics_from_sums(self.totals()), "input_wait_seconds": self.input_wait_seconds}
