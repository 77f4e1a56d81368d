"""The learning-rate schedules as pure functions, and how a resumed run re-plans them without a jump.

One :class:`Schedule` describes both of the project's shapes:

- ``linear`` (BERT): warm up linearly to the peak, and decay polynomially over the whole run
  (``decay_start`` 0) to ``end_learning_rate``.
- ``wsd`` (warmup-stable-decay): warm up, hold the peak, then cool down from ``decay_start``.

:func:`learning_rate` evaluates it with whichever array functions a backend gives (TensorFlow inside its
graph, ``jax.numpy`` under ``jit``, NumPy in the loop), so both backends follow the same numbers. A
checkpoint records the schedule it trained with (:meth:`Schedule.record`); :func:`resume` places the
schedule a resumed run's settings ask for so that the rate continues from the one reached.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..errors import UserInputError

LINEAR, WSD = "linear", "wsd"
# Below this share of the peak, a resumed run's rate counts as spent (a finished run being extended).
SPENT = 0.01


@dataclass(frozen=True)
class Schedule:
    """A warmup from ``warmup_from`` at ``warmup_start`` to ``peak`` at ``warmup_end``; the peak until
    ``decay_start``; then ``decay_from`` decaying (power ``power``) to ``end`` at ``num_train_steps``."""

    kind: str
    peak: float
    num_train_steps: int
    warmup_end: int
    decay_start: int
    end: float = 0.0
    power: float = 1.0
    decay_from: float | None = None  # the peak unless re-planned
    warmup_start: int = 0
    warmup_from: float = 0.0

    @property
    def decay_origin(self) -> float:
        return self.peak if self.decay_from is None else self.decay_from

    def rate(self, step: int) -> float:
        """The rate of the update made at ``step`` (0-based: the step-th update), in Python."""
        return float(learning_rate(self, np.float32(step), np.where, np.clip))

    def record(self, plan: Schedule) -> dict:
        """What a checkpoint's metadata keeps: this schedule, and the one the settings asked for (``plan``),
        so that a resume can tell whether the settings changed (:func:`resume`)."""
        return {**dataclasses.asdict(self), "planned": dataclasses.asdict(plan)}

    def describe(self) -> str:
        warm = (f"warmup to {self.peak:.3g} by step {self.warmup_end}" if self.warmup_end > self.warmup_start
                else f"{self.peak:.3g} from the start")
        hold = f", constant until step {self.decay_start}" if self.decay_start > self.warmup_end else ""
        return (f"{warm}{hold}, then {'linear' if self.power == 1 else f'power-{self.power:g}'} decay from "
                f"{self.rate(self.decay_start) if self.decay_start else self.decay_origin:.3g} to {self.end:.3g} "
                f"at step {self.num_train_steps}")


def learning_rate(s: Schedule, step, where, clip):
    """The schedule at ``step`` (a float32 scalar or tensor) with the backend's ``where`` and ``clip``."""
    span = float(max(1, s.num_train_steps - s.decay_start))
    fraction = clip((step - s.decay_start) / span, 0.0, 1.0)
    decayed = s.end + (s.decay_origin - s.end) * (1.0 - fraction) ** s.power
    rate = where(step < s.decay_start, s.peak, decayed)
    if s.warmup_end <= s.warmup_start:
        return rate
    warm = s.warmup_from + (s.peak - s.warmup_from) * (step - s.warmup_start) / float(s.warmup_end - s.warmup_start)
    return where(step < s.warmup_end, warm, rate)


def cooldown_start(num_train_steps: int, num_cooldown_steps: int, num_warmup_steps: int) -> int:
    """Where a wsd cool-down starts: ``num_cooldown_steps`` (0: 20% of the run) before the end, after warmup."""
    cooldown = num_cooldown_steps or max(1, round(0.2 * num_train_steps))
    return max(num_train_steps - cooldown, num_warmup_steps, 0)


def planned(t) -> Schedule:
    """The schedule a run's train settings (:class:`..config.TrainConfig`, warmup resolved) ask for from step 0."""
    if t.lr_schedule not in (LINEAR, WSD):
        raise UserInputError(f"lr_schedule={t.lr_schedule!r}: choose linear or wsd.")
    decay_start = (cooldown_start(t.num_train_steps, t.num_cooldown_steps, t.num_warmup_steps)
                   if t.lr_schedule == WSD else 0)
    return Schedule(t.lr_schedule, float(t.learning_rate), int(t.num_train_steps), int(t.num_warmup_steps),
                    decay_start, float(t.end_learning_rate), float(t.lr_decay_power))


def from_record(recorded: dict | None, wanted: Schedule) -> Schedule | None:
    """The schedule a checkpoint recorded, including the forms of earlier versions (tf-keras's schedule
    configs; the first JAX backend's ``{"name": "linear", ...}`` without its peak, taken from ``wanted``);
    None when it recorded none."""
    if not recorded:
        return None
    if "kind" in recorded:
        return Schedule(**{f.name: recorded[f.name] for f in dataclasses.fields(Schedule) if f.name in recorded})
    wsd = "decay_start" in recorded
    return Schedule(WSD if wsd else LINEAR, float(recorded.get("learning_rate", wanted.peak)),
                    int(recorded["num_train_steps"]), int(recorded.get("num_warmup_steps", 0)),
                    int(recorded.get("decay_start", 0)), float(recorded.get("end_learning_rate", 0.0)),
                    float(recorded.get("power", 1.0)), recorded.get("decay_from") if wsd else None)


def resume(wanted: Schedule, recorded: dict | None, step: int, rewarm_steps: int = 0) -> tuple[Schedule, str | None]:
    """The schedule a run resumed at ``step`` follows, and what changed (to be logged), or None.

    Unchanged settings continue the recorded schedule exactly. Changed ones (``num_train_steps``, warmup,
    cool-down, end rate) are re-planned from the rate reached, so the rate never jumps: a warmup goes on
    from it, a decay decays on from it to the new end, a wsd run past its new cool-down start cools down
    from now. A finished run being extended (rate about zero) needs ``rewarm_steps``: a new phase that
    warms up from the rate reached to the peak, then decays again.
    """
    before = from_record(recorded, wanted)
    if before is None or step == 0:
        return wanted, None
    if _plan_of(recorded, before) == wanted:
        return before, None
    if step >= wanted.num_train_steps:
        return before, None  # nothing left to train
    reached = before.rate(step)
    change = _what_changed(_plan_of(recorded, before), wanted)
    if reached < SPENT * max(before.peak, 1e-12) and step >= before.warmup_end:
        after = _rewarm(wanted, step, reached, rewarm_steps, change)
    elif step < wanted.warmup_end:
        after = dataclasses.replace(wanted, warmup_start=step, warmup_from=reached)
    elif wanted.kind == WSD and step < wanted.decay_start and reached == before.peak:
        after = wanted
    else:
        after = dataclasses.replace(wanted, decay_start=step, decay_from=reached)
    return after, (f"re-planned at step {step} ({change}): the rate goes on from {reached:.3g}: "
                   f"{after.describe()}")


def _rewarm(wanted: Schedule, step: int, reached: float, rewarm_steps: int, change: str) -> Schedule:
    if rewarm_steps <= 0:
        raise UserInputError(
            f"This run's learning rate had decayed to {reached:.3g} by step {step} ({change}): going on would "
            f"train at about zero. Add --rewarm_steps N (e.g. {max(1, wanted.num_train_steps // 20)}) to start a new "
            f"phase that warms up from {reached:.3g} to learning_rate={wanted.peak:g} over N steps and decays again "
            f"to step {wanted.num_train_steps}.")
    warm_end = min(step + rewarm_steps, wanted.num_train_steps)
    decay_start = warm_end if wanted.kind == LINEAR else max(warm_end, wanted.decay_start)
    return dataclasses.replace(wanted, warmup_start=step, warmup_from=reached, warmup_end=warm_end,
                               decay_start=decay_start, decay_from=None)


def _plan_of(recorded: dict, before: Schedule) -> Schedule:
    """The schedule the recorded run's settings asked for (earlier versions recorded only the one they used)."""
    plan = recorded.get("planned")
    return Schedule(**plan) if plan else before


def _what_changed(old: Schedule, new: Schedule) -> str:
    names = {"num_train_steps": "num_train_steps", "warmup_end": "num_warmup_steps", "decay_start": "cool-down start",
             "end": "end_learning_rate", "peak": "learning_rate", "kind": "lr_schedule", "power": "lr_decay_power"}
    changed = [f"{label} {getattr(old, field)} -> {getattr(new, field)}" for field, label in names.items()
               if getattr(old, field) != getattr(new, field)]
    return ", ".join(changed) or "the schedule changed"
