"""What the run core needs of a backend's trainer: the narrow contract both backends implement."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .checkpoints import CheckpointState
from .resolve import RunPlan
from .schedules import Schedule


class Dispatched(Protocol):
    """A call of steps started by :meth:`Trainer.dispatch`; its figures are read when the loop is ready for them."""

    steps: int
    compile_seconds: float  # what starting it spent compiling (0: nothing was compiled)

    def result(self) -> dict: ...  # its mean metrics (:func:`.metrics.metrics_from_sums`); waits for it

    def finished_at(self) -> float | None: ...  # when it ended (time.perf_counter; None: when it was read)


@dataclass
class Finished:
    """A call that had run to its end when it was dispatched (a backend without asynchronous calls)."""

    metrics: dict
    steps: int
    compile_seconds: float = 0.0
    ended: float | None = None  # time.perf_counter() when it returned

    def result(self) -> dict:
        return self.metrics

    def finished_at(self) -> float | None:
        return self.ended


class Trainer(Protocol):
    """A backend's model, optimizer and input for one :class:`RunPlan`, driven by :mod:`.loop`.

    Everything the two backends would derive the same way (settings, data, vocab, model shape, the
    schedule and its re-planning, the learning rate reported, the statistics' means) lives in the core.
    """

    plan: RunPlan
    steps_per_execution: int  # optimizer steps per compiled call
    example_ids: list[tuple[int, list[int]]]  # (step, ids) of the steps run, with log_example_ids; the loop takes them
    is_chief: bool  # whether this process writes the run folder (one writer when several machines train)

    @property
    def step(self) -> int: ...  # optimizer updates made

    def use_schedule(self, schedule: Schedule) -> None: ...  # before the first step: the schedule to follow

    def start_input(self, step: int) -> None: ...  # the input opened at ``step`` (a pure function of seed, step)

    def dispatch(self, steps: int) -> Dispatched: ...  # start one call of 1..steps_per_execution steps; no waiting

    def train_steps(self, steps: int) -> dict: ...  # run them; their metrics (:func:`.metrics.metrics_from_sums`)

    def evaluate(self) -> dict | None: ...  # the metrics over the eval batches; None without eval data

    def checkpoint_state(self) -> CheckpointState: ...

    def weights_finite(self) -> bool: ...  # no NaN/Inf in weights or optimizer moments: what may be saved

    def any_worker(self, flag: bool) -> bool: ...  # ``flag`` agreed over every machine; itself on one

    def describe(self) -> str: ...  # the backend and its devices, for the log and the run summary

    @property
    def precision(self) -> str: ...  # float32, bfloat16 or float16

    @property
    def peak_flops(self) -> float | None: ...  # the devices' dense peak FLOP/s, all together, at that precision

    def close(self) -> None: ...  # release input threads
