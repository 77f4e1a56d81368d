"""The training loop (:func:`run_training`): resume, train until the next boundary, do the boundary's work (log,
evaluate, save), stop.

The loop is the same for both backends: :func:`..training.train` hands it a :class:`.protocol.Trainer` (TensorFlow's
:class:`..tf_backend.trainer.Trainer` or :class:`..jax_backend.trainer.JaxTrainer`), which owns the model, the
optimizer, the input and the state a checkpoint holds. Checkpoints are saved every
``save_checkpoints_steps`` and/or ``save_checkpoints_minutes``, at the end, and before stopping for the session
deadline or SIGTERM/SIGINT, or because the durable copy fell too far behind (:mod:`.mirror`);
starting again in the same folder continues exactly: the same weights, optimizer state, step, input
position and dropout masks, so the run neither repeats nor skips an example. One process trains in a
run folder at a time (:mod:`.run_lock`). A loss, weight or optimizer moment that is no longer finite
stops training with :class:`TrainingDiverged` before anything is saved, so the last good checkpoint
stays the newest.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass, field

from ..errors import UserInputError
from ..formatting import TerminalProgress, hms
from . import schedules
from .checkpoint_space import check_rooms
from .checkpoints import CheckpointManager, FollowerCheckpoints
from .event_log import ScalarLog
from .metrics import eval_random_next_share, format_metrics, nsp_majority_note
from .mirror import CheckpointMirror
from .mirror_owner import claim
from .peaks import mfu, overstated_peak
from .protocol import Trainer
from .run_folder import RunFolder, run_identity
from .run_lock import RunLock
from .session import SessionGuard, session_deadline

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    """What a run did: steps, the loss curve, eval figures before and after, and throughput."""

    output_dir: str
    steps: int
    history: list[dict] = field(default_factory=list)
    initial_eval: dict | None = None
    final_eval: dict | None = None
    examples_per_second: float = 0.0
    seconds_to_first_step: float = 0.0
    stopped_reason: str | None = None  # set when training stopped early (deadline, SIGTERM) to resume later
    input_wait_share: float | None = None  # of the training time, the devices waiting on input (backends that say)
    nsp_note: str = ""  # the final NSP accuracy's, when it is the majority class share

    def summary(self) -> str:
        parts = [f"Trained to step {self.steps} in {self.output_dir}"]
        if self.history:
            parts.append(f"last train loss {self.history[-1]['loss']:.4f}")
        if self.final_eval:
            e = self.final_eval
            over = f" ({e['sequences']} sequences)" if "sequences" in e else ""
            parts.append(f"eval{over} MLM accuracy {e['mlm_accuracy']:.4f}, loss {e['mlm_loss']:.4f}")
            if "nsp_accuracy" in e:
                parts.append(f"NSP accuracy {e['nsp_accuracy']:.4f}{self.nsp_note}")
        parts.append(f"{self.examples_per_second:.1f} examples/s" if self.examples_per_second else
                     "no speed measured this session (its steps ran in one call, compiling included)")
        if self.input_wait_share is not None:
            parts.append(f"input wait {self.input_wait_share:.1%} of the time")
        return "; ".join(parts)


class Throughput:
    """Steps per second over the timed calls; the first call (graph build and compilation) is kept apart."""

    def __init__(self, train_seconds: float = 0.0, resumed_rate: float = 0.0):
        self.started = time.perf_counter()
        self.train_seconds = train_seconds  # all sessions of the run, for the status and the ETA
        self.resumed_rate = resumed_rate  # the rate the run had measured when it was saved (0: a new run)
        self.seconds_to_first_step = 0.0
        self.steps = 0
        self.seconds = 0.0
        self.last_rate = 0.0
        self.input_wait: float | None = None  # seconds the devices waited on input, where the backend says
        self.first_wait_share: float | None = None

    def record(self, steps: int, seconds: float, input_wait: float | None = None) -> None:
        self.train_seconds += seconds
        if not self.seconds_to_first_step:
            self.seconds_to_first_step = time.perf_counter() - self.started
            self.last_rate = steps / seconds
            self.first_wait_share = None if input_wait is None else input_wait / seconds
        else:
            self.steps += steps
            self.seconds += seconds
            if input_wait is not None:
                self.input_wait = (self.input_wait or 0.0) + input_wait

    @property
    def steps_per_second(self) -> float:
        """The rate measured this session after its first call; until then the run's own, as saved (a resumed
        run), else that first call's (which includes compiling)."""
        return self.steps / self.seconds if self.seconds else self.resumed_rate or self.last_rate

    @property
    def input_wait_share(self) -> float | None:
        return self.input_wait / self.seconds if self.input_wait is not None else self.first_wait_share


class SaveCadence:
    """When a checkpoint is due: every ``save_checkpoints_steps`` steps, every ``save_checkpoints_minutes``, or both."""

    def __init__(self, steps: int, minutes: float):
        self.steps, self.seconds, self.last = steps, minutes * 60.0, time.monotonic()

    def due(self, trainer: Trainer, step: int) -> bool:
        if self.steps and step % self.steps == 0:
            return True
        return bool(self.seconds) and trainer.any_worker(time.monotonic() - self.last >= self.seconds)  # all agree

    def saved(self) -> None:
        self.last = time.monotonic()


class TrainingDiverged(UserInputError):
    """The loss or the weights are no longer finite; nothing was saved after the last good checkpoint."""


def run_training(trainer: Trainer, output_dir: str, progress: bool | None = None,
                 set_aside_damaged_checkpoints: bool = False) -> TrainResult:
    """The loop, holding the run folder's lock: resume, train in chunks, log, evaluate, checkpoint, stop in time."""
    run = RunFolder(output_dir)
    with RunLock(run.lock_file) if trainer.is_chief else contextlib.nullcontext():
        return _run_locked(trainer, run, progress, set_aside_damaged_checkpoints)


def _run_locked(trainer: Trainer, run: RunFolder, progress: bool | None, set_aside_damaged: bool) -> TrainResult:
    t = trainer.plan.config.train
    output_dir = str(run.path)
    manager, mirror = _checkpoints(trainer, run)
    resumed = _resume(trainer, run, manager, set_aside_damaged)
    throughput = Throughput(resumed.get("train_seconds", 0.0), resumed.get("steps_per_second", 0.0))
    flops, peak = _flops_and_peak(trainer)
    if mirror is not None:
        mirror.start(trainer.step or None)
    scalars = ScalarLog(run, enabled=trainer.is_chief)  # several machines: the chief writes the run's logs
    result = TrainResult(output_dir=output_dir, steps=trainer.step)
    if trainer.step == 0:
        result.initial_eval = _evaluate(trainer, scalars, 0, "Eval at step 0")
    bar = _progress_bar(trainer, progress)
    guard = SessionGuard(session_deadline(t.session_hours), margin_seconds=t.session_margin_minutes * 60)
    cadence = SaveCadence(t.save_checkpoints_steps, t.save_checkpoints_minutes)
    try:
        while trainer.step < t.num_train_steps and not result.stopped_reason:
            step, target = trainer.step, _next_boundary(trainer)
            tick = time.perf_counter()
            metrics = trainer.train_steps(target - step)
            seconds = time.perf_counter() - tick
            _check_finite(trainer, manager, metrics, step, target)
            throughput.record(target - step, seconds, metrics.get("input_wait_seconds"))
            if trainer.is_chief:
                _append_example_ids(trainer, run)
            metrics.update(steps_per_second=throughput.steps_per_second,
                           examples_per_second=throughput.steps_per_second * t.train_batch_size,
                           learning_rate=trainer.plan.schedule.rate(max(trainer.step - 1, 0)))
            if peak:
                metrics["mfu"] = mfu(metrics["examples_per_second"], flops, peak)
                if metrics["mfu"] > 1 and not any((h.get("mfu") or 0) > 1 for h in result.history):  # said once
                    log.warning(overstated_peak(metrics["mfu"], peak, t.peak_tflops, trainer.describe()))
            result.history.append({"step": target, **metrics})
            bar.show(target, lambda: progress_line(target, t.num_train_steps, metrics, _saved_note(manager)))  # noqa: B023
            result.stopped_reason = _at_boundary(trainer, target, metrics, scalars, manager, throughput,
                                                 guard, seconds, cadence)
    finally:
        guard.close()
        bar.close()
        trainer.close()
        behind = mirror.finish(trainer.step) if mirror is not None else None
    result.stopped_reason = result.stopped_reason or behind
    result.steps = trainer.step
    timed = throughput.steps / throughput.seconds if throughput.seconds else 0.0
    result.examples_per_second = timed * t.train_batch_size
    result.seconds_to_first_step = throughput.seconds_to_first_step
    result.input_wait_share = throughput.input_wait_share
    if not result.stopped_reason:
        result.final_eval = _evaluate(trainer, scalars, result.steps, f"Final eval at step {result.steps}")
        result.nsp_note = nsp_majority_note(result.final_eval or {}, _random_next_share(trainer))
    if not result.stopped_reason and trainer.is_chief:
        run.write_summary({"steps": result.steps, "initial_eval": result.initial_eval,
                           "final_eval": result.final_eval, "examples_per_second": result.examples_per_second,
                           "seconds_to_first_step": result.seconds_to_first_step,
                           "input_wait_share": result.input_wait_share,
                           "train_seconds": throughput.train_seconds, "accelerator": trainer.describe()})
    scalars.close()
    return result


# -- the steps of the loop --------------------------------------------------------------------------
def _checkpoints(trainer: Trainer, run: RunFolder) -> tuple[CheckpointManager, CheckpointMirror | None]:
    """The run's checkpoint manager, and the mirror it copies to (with the run's transfer settings)."""
    s = trainer.plan.config.storage
    mirror = None
    if not trainer.is_chief:  # one writer: the chief; the others take part in its saves
        return FollowerCheckpoints(run.checkpoints, trainer.checkpoint_state()), None
    if s.mirror_dir:
        from ..storage import drive

        drive.ensure_drive_ready(s.mirror_dir, mount=s.mount_drive)
        mirror = CheckpointMirror(run, s.mirror_dir, keep=s.mirror_keep, options=s.transfer_options(),
                                  max_lag=s.mirror_max_lag, on_failure=s.mirror_failure)
    manager = CheckpointManager(run.checkpoints, trainer.checkpoint_state(), keep_max=s.keep_checkpoint_max,
                                mirror=mirror)
    log.info(check_rooms(run, s, trainer.checkpoint_state().estimated_bytes(), manager.safety_margin))
    return manager, mirror


def _resume(trainer: Trainer, run: RunFolder, manager: CheckpointManager, set_aside_damaged: bool) -> dict:
    """Check the folder fits this run, restore its newest checkpoint, record the run, open the input at the
    restored step; returns the checkpoint's metadata (the seconds trained, the rate measured; empty when new)."""
    plan = trainer.plan
    identity = run_identity(plan.config, plan.model_config, plan.data)
    run.check_can_resume(identity)
    if getattr(manager, "mirror", None) is not None:
        claim(manager.mirror, identity)  # before a checkpoint is fetched from it: the copy must be this run's
    restored = manager.restore_latest(set_aside_damaged)
    _follow_schedule(trainer, restored.metadata.get("lr_schedule") if restored else None)
    if trainer.is_chief:
        run.write_run_files(plan.config, plan.model_config, plan.vocab)
        run.record_identity(identity)
    trainer.start_input(trainer.step)
    if restored is None:
        return {}
    log.info("Resuming from %s: step %d of %d.", restored.path, trainer.step, trainer.plan.config.train.num_train_steps)
    return restored.metadata


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


def _follow_schedule(trainer: Trainer, recorded: dict | None) -> None:
    """Place the schedule the run follows from the restored step: the one recorded when the settings are the
    same, else re-planned from the rate reached (:func:`.schedules.resume`); an automatic warmup stays as
    recorded, since it was chosen from the settings the run started with."""
    plan, step = trainer.plan, trainer.step
    t = plan.config.train
    if recorded and plan.warmup_was_auto:
        t.num_warmup_steps = int((recorded.get("planned") or {}).get("warmup_end", recorded.get("num_warmup_steps",
                                                                                               t.num_warmup_steps)))
        plan.planned_schedule = schedules.planned(t)
    plan.schedule, change = schedules.resume(plan.planned_schedule, recorded, step, t.rewarm_steps)
    if change:
        log.warning("Learning rate: %s.", change)
    log.info("Learning rate: %s.", plan.schedule.describe())
    trainer.use_schedule(plan.schedule)


def _next_boundary(trainer: Trainer) -> int:
    """The next step where something happens (log, eval, save, the end), at most one compiled call away."""
    t, step = trainer.plan.config.train, trainer.step
    total = t.num_train_steps

    def boundary(every: int) -> int:
        return min(total, (step // every + 1) * every) if every else total

    return min(boundary(t.log_every_steps), boundary(t.eval_every_steps), boundary(t.save_checkpoints_steps),
               step + trainer.steps_per_execution)


def _at_boundary(trainer: Trainer, step: int, metrics: dict, scalars: ScalarLog, manager: CheckpointManager,
                 throughput: Throughput, guard: SessionGuard, seconds: float, cadence: SaveCadence) -> str | None:
    """Log, evaluate and save as this step calls for; save and return the reason when training must stop."""
    t = trainer.plan.config.train
    total = t.num_train_steps
    mirror = getattr(manager, "mirror", None)  # the chief's durable copy
    if mirror is not None:
        mirror.retry_if_failed()  # a mirror that recovered catches up before the next save
    if step % t.log_every_steps == 0 or step == total:
        scalars.write("train", metrics, step)
        log.info("%s", progress_line(step, total, metrics, _saved_note(manager)))
    if t.eval_every_steps and step % t.eval_every_steps == 0 and step < total:
        _evaluate(trainer, scalars, step, f"Eval at step {step}")
    stop_reason = guard.should_stop(next_chunk_seconds=seconds)
    save = cadence.due(trainer, step) or step == total
    if save and stop_reason is None and mirror is not None and step < total:
        stop_reason = mirror.check_before_save(step)  # the durable copy is too far behind
    if trainer.any_worker(stop_reason is not None):  # several machines stop together
        stop_reason = stop_reason or "another worker is stopping"
    stopping = stop_reason is not None and step < total
    if save or stopping:
        if not trainer.weights_finite():
            raise _diverged(trainer, manager, step, "weights or optimizer moments that are no longer finite")
        manager.save(step, {"records_consumed": step * t.train_batch_size, "train_seconds": throughput.train_seconds,
                            "steps_per_second": throughput.steps_per_second, "mfu": metrics.get("mfu"),
                            "saved_at": time.time(),
                            "lr_schedule": trainer.plan.schedule.record(trainer.plan.planned_schedule)})
        trainer.any_worker(False)  # several machines: each waits here until the chief's checkpoint is complete
        cadence.saved()
    if not stopping:
        return None
    log.warning("Stopped at step %d of %d: %s. Run the same command again (same output_dir) to continue from "
                "this step.", step, total, stop_reason)
    return stop_reason


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


def _saved_note(manager: CheckpointManager) -> str:
    """The newest durable step: the durable copy's (and how far behind it is) when there is one, else the run
    folder's newest checkpoint."""
    mirror = getattr(manager, "mirror", None)
    if mirror is not None:
        return mirror.note()
    saved = manager.local_checkpoints()
    return f"saved step {saved[0].step}" if saved else "saved none yet"


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


def _evaluate(trainer: Trainer, scalars: ScalarLog, step: int, label: str) -> dict | None:
    """Evaluate, log the figures with the number of sequences they are over, and write them to the eval curves."""
    evaluation = trainer.evaluate()
    if evaluation:
        scalars.write("eval", {k: v for k, v in evaluation.items() if k != "sequences"}, step)
        over = f" ({evaluation['sequences']} sequences)" if "sequences" in evaluation else ""
        log.info("%s%s: %s", label, over, format_metrics(evaluation, _random_next_share(trainer)))
    return evaluation


def _random_next_share(trainer: Trainer) -> float | None:
    return eval_random_next_share(trainer.plan.data.data_dir) if trainer.plan.with_nsp else None


def _progress_bar(trainer: Trainer, progress: bool | None):
    """The notebooks' bar and line on a terminal (``progress`` None: when stdout is one, the chief's only)."""
    shown = sys.stdout.isatty() and trainer.is_chief if progress is None else progress
    return TerminalProgress(trainer.plan.config.train.num_train_steps, trainer.step, disable=not shown)


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
