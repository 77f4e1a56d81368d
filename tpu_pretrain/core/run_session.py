"""What one session of a run holds while the loop trains (:class:`RunSession`): its checkpoints and durable copy,
its curves, its pace, the session guard and the save cadence, with the few things the loop asks of them: read a
call's figures (:meth:`RunSession.report`), say whether the next step needs the state (:meth:`RunSession.needs_state`),
and do a boundary's evaluation and save (:meth:`RunSession.at_state`).

The figures are honest: the rate and MFU shown, saved and summarised are the steady rate of calls that ran back to
back (:class:`Pace`); the first call of a session, a call that compiled, evals and saves are left out of it and
said on their own lines, so a 300-step run and a 30,000-step run report the same speed.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time

from ..errors import UserInputError
from ..formatting import TerminalProgress, hms
from .checkpoints import CheckpointManager
from .event_log import ScalarLog
from .metrics import eval_random_next_share, format_metrics
from .mirror import CheckpointMirror
from .overfit import HeldOutWatch
from .peaks import mfu, overstated_peak
from .protocol import Dispatched, Trainer
from .run_folder import RunFolder
from .session import SessionGuard, session_deadline

log = logging.getLogger(__name__)


class Pace:
    """The run's speed: steps per second over the calls that ran back to back (the steady rate), the seconds
    trained in all sessions (for the status and the ETA), and what was left out: the first call of the session
    (graph build, compile, the devices warming up), any call that compiled, and boundary work (:meth:`pause`)."""

    def __init__(self, train_seconds: float = 0.0, resumed_rate: float = 0.0):
        self.started = self.clock = time.perf_counter()
        self.train_seconds = train_seconds
        self.resumed_rate = resumed_rate  # the rate the run had measured when it was saved (0: a new run)
        self.seconds_to_first_step = self.compile_seconds = 0.0
        self.calls = self.steps = 0
        self.seconds = 0.0
        self.first_rate = 0.0
        self.input_wait: float | None = None  # seconds the devices waited on input, where the backend says

    def record(self, steps: int, compile_seconds: float, input_wait: float | None, ended: float | None = None
               ) -> float:
        """A call's figures were just read: the seconds from the end of the call before (or a pause) to ``ended``,
        when the devices finished this one (None: now, the reading), which count in the steady rate unless the call
        was the session's first or compiled. Its end, not its reading: the loop reads a call after dispatching the
        next, which on a GPU can hold the host until that one has nearly run (a call whose trip count XLA does not
        know)."""
        now = time.perf_counter() if ended is None else ended
        seconds, self.clock = max(now - self.clock, 0.0), now
        self.train_seconds += seconds
        self.calls += 1
        self.compile_seconds += compile_seconds
        if self.calls == 1:
            self.seconds_to_first_step = now - self.started
            self.first_rate = steps / seconds
        if self.calls > 1 and not compile_seconds:
            self.steps += steps
            self.seconds += seconds
            if input_wait is not None:
                self.input_wait = (self.input_wait or 0.0) + input_wait
        return seconds

    def pause(self) -> None:
        """Boundary work (an eval, a save) just ended: the time it took is neither training nor steady."""
        self.clock = time.perf_counter()

    @property
    def steady_rate(self) -> float:
        """Steps/s of this session's steady calls (0 before the second call)."""
        return self.steps / self.seconds if self.seconds else 0.0

    @property
    def steps_per_second(self) -> float:
        """The steady rate; until it is measured the run's own as saved (a resumed run), else the first call's."""
        return self.steady_rate or self.resumed_rate or self.first_rate

    @property
    def input_wait_share(self) -> float | None:
        return self.input_wait / self.seconds if self.input_wait is not None and self.seconds else None


class SaveCadence:
    """When a checkpoint is due: every ``save_checkpoints_steps`` steps, every ``save_checkpoints_minutes``, or both."""

    def __init__(self, steps: int, minutes: float):
        self.steps, self.seconds, self.last = steps, minutes * 60.0, time.monotonic()

    def due_by_steps(self, step: int) -> bool:
        return bool(self.steps) and step % self.steps == 0

    def due_by_time(self, trainer: Trainer) -> bool:
        return bool(self.seconds) and trainer.any_worker(time.monotonic() - self.last >= self.seconds)  # all agree

    def saved(self) -> None:
        self.last = time.monotonic()


class TrainingDiverged(UserInputError):
    """The loss or the weights are no longer finite; nothing was saved after the last good checkpoint."""


class RunSession:
    """One session of a run: checkpoints, durable copy, curves, pace, guard and cadence, for :mod:`.loop`."""

    def __init__(self, trainer: Trainer, run: RunFolder, manager: CheckpointManager, mirror: CheckpointMirror | None,
                 resumed: dict, step: int, progress: bool | None):
        self.trainer, self.run, self.manager, self.mirror = trainer, run, manager, mirror
        self.train = t = trainer.plan.config.train
        self.pace = Pace(resumed.get("train_seconds", 0.0), resumed.get("steps_per_second", 0.0))
        self.flops, self.peak = _flops_and_peak(trainer)
        self.scalars = ScalarLog(run, enabled=trainer.is_chief)  # several machines: the chief writes the run's logs
        self.guard = SessionGuard(session_deadline(t.session_hours), margin_seconds=t.session_margin_minutes * 60)
        self.cadence = SaveCadence(t.save_checkpoints_steps, t.save_checkpoints_minutes)
        shown = sys.stdout.isatty() and trainer.is_chief if progress is None else progress
        self.bar = TerminalProgress(t.num_train_steps, step, disable=not shown)
        self.history: list[dict] = []
        self.stop_reason: str | None = None  # decided while a call ran: the loop stops at the step it ends at
        self.save_asked = False  # the time cadence came due while a call ran: save at the step it ends at
        self.last_seconds = 0.0  # the last call's time, from the reading of the one before
        self.held_out = HeldOutWatch.start(trainer, manager)  # passes over the data said; the held-out loss's turn

    # -- a call's figures ---------------------------------------------------------------------------
    def report(self, call: Dispatched, last: int) -> None:
        """Read the call that ended at step ``last`` (it waits for it), check it and log it."""
        t, trainer = self.train, self.trainer
        metrics = call.result()
        _check_finite(trainer, self.manager, metrics, last - call.steps, last)
        seconds = self.pace.record(call.steps, call.compile_seconds, metrics.get("input_wait_seconds"),
                                   call.finished_at())
        if call.compile_seconds:
            log.info("Compiled the training call in %.1f s (left out of the rate).", call.compile_seconds)
        if trainer.is_chief:
            _append_example_ids(trainer, self.run)
        rate = self.pace.steps_per_second
        metrics.update(steps_per_second=rate, examples_per_second=rate * t.train_batch_size,
                       learning_rate=trainer.plan.schedule.rate(max(last - 1, 0)))
        if "input_wait_seconds" in metrics:
            metrics["input_wait_share"] = metrics["input_wait_seconds"] / max(seconds, 1e-9)
        if self.peak:
            metrics["mfu"] = mfu(metrics["examples_per_second"], self.flops, self.peak)
            if metrics["mfu"] > 1 and not any((h.get("mfu") or 0) > 1 for h in self.history):  # said once
                log.warning(overstated_peak(metrics["mfu"], self.peak, t.peak_tflops, trainer.describe()))
        self.history.append({"step": last, **metrics})
        self.bar.show(last, lambda: progress_line(last, t.num_train_steps, metrics, self.saved_note()))
        if last % t.log_every_steps == 0 or last == t.num_train_steps:
            self.scalars.write("train", metrics, last)
            log.info("%s", progress_line(last, t.num_train_steps, metrics, self.saved_note()))
        if self.mirror is not None:
            self.mirror.retry_if_failed()  # a mirror that recovered catches up before the next save
        self.last_seconds = seconds

    # -- the state at a boundary ---------------------------------------------------------------------
    def wants_state(self) -> bool:
        """Asked before each dispatch while a call runs (by every process at the same point): whether the session
        must stop, or a save by time is due, at the step that call ends at. The deadline counts the call in
        flight and one more."""
        trainer = self.trainer
        wanted = self.stop_reason or self.guard.should_stop(next_chunk_seconds=2 * self.last_seconds)
        if trainer.any_worker(wanted is not None):  # several machines stop together
            self.stop_reason = wanted or "another worker is stopping"
        self.save_asked = self.save_asked or self.cadence.due_by_time(trainer)
        return self.stop_reason is not None or self.save_asked

    def needs_state(self, step: int) -> bool:
        """Whether ``step`` must be reached with nothing in flight: an eval or a save is due by steps, or the run
        ends there (a stop or a save by time is :meth:`wants_state`'s)."""
        t = self.train
        return (step >= t.num_train_steps or self.cadence.due_by_steps(step)
                or bool(t.eval_every_steps and step % t.eval_every_steps == 0))

    def at_state(self, step: int) -> str | None:
        """Evaluate and save as ``step`` calls for; save and return the reason when training must stop."""
        t, total, trainer = self.train, self.train.num_train_steps, self.trainer
        if t.eval_every_steps and step % t.eval_every_steps == 0 and step < total:
            self.evaluate(step, f"Eval at step {step}")
        stop_reason = self.stop_reason or self.guard.should_stop(next_chunk_seconds=self.last_seconds)
        save = self.save_asked or self.cadence.due_by_steps(step) or step == total
        if save and stop_reason is None and self.mirror is not None and step < total:
            stop_reason = self.mirror.check_before_save(step)  # the durable copy is too far behind
        if trainer.any_worker(stop_reason is not None):  # several machines stop together
            stop_reason = stop_reason or "another worker is stopping"
        stopping = stop_reason is not None and step < total
        if save or stopping:
            self.save(step)
        self.pace.pause()
        if not stopping:
            return None
        log.warning("Stopped at step %d of %d: %s. Run the same command again (same output_dir) to continue from "
                    "this step.", step, total, stop_reason)
        return stop_reason

    def save(self, step: int) -> None:
        trainer = self.trainer
        if not trainer.weights_finite():
            raise _diverged(trainer, self.manager, step, "weights or optimizer moments that are no longer finite")
        mfu_now = self.history[-1].get("mfu") if self.history else None
        self.manager.save(step, {"records_consumed": step * self.train.train_batch_size,
                                 "train_seconds": self.pace.train_seconds,
                                 "steps_per_second": self.pace.steps_per_second, "mfu": mfu_now,
                                 "saved_at": time.time(),
                                 "lr_schedule": trainer.plan.schedule.record(trainer.plan.planned_schedule)})
        trainer.any_worker(False)  # several machines: each waits here until the chief's checkpoint is complete
        self.cadence.saved()
        self.save_asked = False

    def evaluate(self, step: int, label: str) -> dict | None:
        """Evaluate, log the figures with the number of sequences they are over and the time taken, and write them
        to the eval curves."""
        tick = time.perf_counter()
        evaluation = self.trainer.evaluate()
        if evaluation:
            self.scalars.write("eval", {k: v for k, v in evaluation.items() if k != "sequences"}, step)
            over = f" ({evaluation['sequences']} sequences)" if "sequences" in evaluation else ""
            log.info("%s%s: %s (in %.1f s)", label, over, format_metrics(evaluation, self.random_next_share()),
                     time.perf_counter() - tick)
            self.held_out.seen(step, evaluation)
        self.pace.pause()
        return evaluation

    def random_next_share(self) -> float | None:
        trainer = self.trainer
        return eval_random_next_share(trainer.plan.data.data_dir) if trainer.plan.with_nsp else None

    def saved_note(self) -> str:
        """The newest durable step: the durable copy's (and how far behind it is) when there is one, else the run
        folder's newest checkpoint."""
        if self.mirror is not None:
            return self.mirror.note()
        saved = self.manager.local_checkpoints()
        return f"saved step {saved[0].step}" if saved else "saved none yet"

    def close(self) -> None:
        self.guard.close()
        self.bar.close()


def progress_line(step: int, total: int, metrics: dict, saved: str) -> str:
    """The line a person reads: step/total, the loss, the learning rate, steps/s and sequences/s, MFU where the
    peak is known, the share of time waiting on input where the backend says, the ETA at the run's own rate,
    and the newest durable step (``saved``)."""
    rate = metrics["steps_per_second"]
    figures = [format_metrics(metrics), f"lr {metrics['learning_rate']:.3g}", f"{rate:.2f} steps/s",
               f"{metrics['examples_per_second']:.1f} sequences/s"]
    if metrics.get("mfu") is not None:
        figures.append(f"MFU {metrics['mfu']:.1%}")
    if "input_wait_share" in metrics:
        figures.append(f"input wait {metrics['input_wait_share']:.0%}")
    figures.append(f"ETA {hms((total - step) / rate if rate else float('nan'))}")
    return f"step {step}/{total}: {', '.join(figures)}; {saved}"


def _flops_and_peak(trainer: Trainer) -> tuple[float, float | None]:
    """The model's training FLOPs per sequence, and the devices' peak FLOP/s (stated, else published; None when
    unknown) that the MFU is measured against."""
    plan = trainer.plan
    stated = plan.config.train.peak_tflops
    flops = plan.training_flops_per_sequence()
    peak = stated * 1e12 if stated else trainer.peak_flops
    if peak:
        log.info("MFU against %s peak of %.3g TFLOP/s (%s), %.3g GFLOP per training sequence.",
                 "the stated" if stated else "the published", peak / 1e12, trainer.describe(), flops / 1e9)
    else:
        log.info("No MFU: the peak of %s is not known (state it with --peak_tflops).", trainer.describe())
    return flops, peak


def _check_finite(trainer: Trainer, manager: CheckpointManager, metrics: dict, first: int, last: int) -> None:
    """Stop before anything is saved when the steps just run gave a non-finite loss (float16: when the
    weights went with it; loss scaling skips an overflowing step on its own)."""
    if math.isfinite(metrics["loss"]):
        return
    if trainer.precision == "float16" and trainer.weights_finite():
        log.warning("Steps %d-%d: the loss overflowed float16; loss scaling skipped those updates.", first + 1, last)
        return
    raise _diverged(trainer, manager, last, f"a loss of {metrics['loss']} in steps {first + 1}-{last}")


def _diverged(trainer: Trainer, manager: CheckpointManager, step: int, what: str) -> TrainingDiverged:
    t = trainer.plan.config.train
    saved = manager.local_checkpoints()
    kept = (f"The newest checkpoint, {saved[0].path} (step {saved[0].step}), is from before and intact; "
            "nothing was saved after it." if saved else "No checkpoint was saved.")
    return TrainingDiverged(
        f"Training diverged at step {step}: {what}. {kept} Lower --learning_rate (now {t.learning_rate:g}), "
        f"lengthen --num_warmup_steps (now {t.num_warmup_steps}), clip gradients with --clip_norm (now "
        f"{t.clip_norm:g}; 1.0 is BERT's), or train in --mixed_precision float32 (now "
        f"{trainer.precision}); then run train again: it resumes from the newest checkpoint.")


def _append_example_ids(trainer: Trainer, run: RunFolder) -> None:
    """Append the example ids each step used to logs/example_ids.jsonl (a replayed step appears again)."""
    if not trainer.example_ids:
        return
    run.logs.mkdir(parents=True, exist_ok=True)
    with open(run.example_ids, "a", encoding="utf-8") as handle:
        for step, ids in trainer.example_ids:
            handle.write(json.dumps({"step": step, "ids": ids}) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    trainer.example_ids.clear()
