"""The training loop (:func:`run_training`): resume, train until the next boundary, do the boundary's work (log,
evaluate, save), stop.

The loop is the same for both backends: :func:`..training.train` hands it a :class:`.protocol.Trainer` (TensorFlow's
:class:`..tf_backend.trainer.Trainer` or :class:`..jax_backend.trainer.JaxTrainer`), which owns the model, the
optimizer, the input and the state a checkpoint holds; what the session holds besides (checkpoints, durable copy,
curves, pace, guard, cadence) is one :class:`.run_session.RunSession`. The devices are kept busy: each call is
dispatched before the last one's figures are read, and the loop waits for the devices with nothing in flight only
where a step's state is needed (an eval, a save, the end, a stop). Calls end at log, eval and save boundaries
without a train of single steps (a backend's one compiled call takes any count of steps up to its
``steps_per_execution``). Checkpoints are saved every
``save_checkpoints_steps`` and/or ``save_checkpoints_minutes``, at the end, and before stopping for the session
deadline or SIGTERM/SIGINT, or because the durable copy fell too far behind (:mod:`.mirror`);
starting again in the same folder continues exactly: the same weights, optimizer state, step, input
position and dropout masks, so the run neither repeats nor skips an example. One process trains in a
run folder at a time (:mod:`.run_lock`). A loss, weight or optimizer moment that is no longer finite
stops training with :class:`.run_session.TrainingDiverged` before anything is saved, so the last good checkpoint
stays the newest.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field

from .checkpoint_space import check_rooms
from .checkpoints import CheckpointManager, FollowerCheckpoints
from .metrics import nsp_majority_note
from .mirror import CheckpointMirror
from .mirror_owner import claim
from .protocol import Trainer
from .run_folder import RunFolder, run_identity
from .run_lock import RunLock
from .run_session import RunSession, TrainingDiverged, progress_line

__all__ = ["TrainResult", "TrainingDiverged", "progress_line", "run_training"]
log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    """What a run did: steps, the loss curve, eval figures before and after, and throughput."""

    output_dir: str
    steps: int
    history: list[dict] = field(default_factory=list)
    initial_eval: dict | None = None
    final_eval: dict | None = None
    examples_per_second: float = 0.0  # the steady rate (:class:`.run_session.Pace`)
    seconds_to_first_step: float = 0.0
    compile_seconds: float = 0.0
    stopped_reason: str | None = None  # set when training stopped early (deadline, SIGTERM) to resume later
    input_wait_share: float | None = None  # of the training time, the devices waiting on input (backends that say)
    nsp_note: str = ""  # the final NSP accuracy's, when it is the majority class share
    chief: bool = True  # whether this process wrote output_dir (a follower of several processes writes none)

    def summary(self) -> str:
        parts = [f"Trained to step {self.steps} in {self.output_dir}" if self.chief else
                 f"Trained to step {self.steps} as a follower: process 0 wrote the run folder (its --output_dir)"]
        if self.history:
            parts.append(f"last train loss {self.history[-1]['loss']:.4f}")
        if self.final_eval:
            e = self.final_eval
            over = f" ({e['sequences']} sequences)" if "sequences" in e else ""
            parts.append(f"eval{over} MLM accuracy {e['mlm_accuracy']:.4f}, loss {e['mlm_loss']:.4f}")
            if "nsp_accuracy" in e:
                parts.append(f"NSP accuracy {e['nsp_accuracy']:.4f}{self.nsp_note}")
        parts.append(f"{self.examples_per_second:.1f} examples/s steady" if self.examples_per_second else
                     "no speed measured this session (its steps ran in one call, compiling included)")
        if self.compile_seconds:
            parts.append(f"compiled in {self.compile_seconds:.1f} s")
        if self.input_wait_share is not None:
            parts.append(f"input wait {self.input_wait_share:.1%} of the time")
        return "; ".join(parts)


def run_training(trainer: Trainer, output_dir: str, progress: bool | None = None,
                 set_aside_damaged_checkpoints: bool = False) -> TrainResult:
    """The loop, holding the run folder's lock: resume, train in calls, log, evaluate, checkpoint, stop in time."""
    run = RunFolder(output_dir)
    with RunLock(run.lock_file) if trainer.is_chief else contextlib.nullcontext():
        return _run_locked(trainer, run, progress, set_aside_damaged_checkpoints)


def _run_locked(trainer: Trainer, run: RunFolder, progress: bool | None, set_aside_damaged: bool) -> TrainResult:
    manager, mirror = _checkpoints(trainer, run)
    resumed = _resume(trainer, run, manager, mirror, set_aside_damaged)
    result = TrainResult(output_dir=str(run.path), steps=trainer.step, chief=trainer.is_chief)
    session = RunSession(trainer, run, manager, mirror, resumed, result.steps, progress)
    if mirror is not None:
        mirror.start(result.steps or None)
    if result.steps == 0:
        result.initial_eval = session.evaluate(0, "Eval at step 0")
    try:
        result.stopped_reason = _train(trainer, session, result.steps)
    finally:
        session.close()
        trainer.close()
        behind = mirror.finish(trainer.step) if mirror is not None else None
    result.stopped_reason = result.stopped_reason or behind
    _finish(trainer, run, session, result)
    return result


def _train(trainer: Trainer, session: RunSession, step: int) -> str | None:
    """Train from ``step``: each call is dispatched before the last one's figures are read, so the devices never
    wait on the host's bookkeeping; where a step's state is needed (an eval or save due, a stop, the end), the loop
    reads the last call and does the boundary's work with nothing in flight. Returns why training stopped early
    (None: it reached the end)."""
    total, in_flight = session.train.num_train_steps, None
    while step < total:
        if in_flight is None or not session.wants_state():
            call = trainer.dispatch(_next_boundary(trainer, step) - step)
            if in_flight is not None:
                session.report(*in_flight)  # the last call's figures, read while this one runs
            in_flight, step = (call, step + call.steps), step + call.steps
            if not session.needs_state(step):
                continue
        session.report(*in_flight)
        in_flight = None
        stopped = session.at_state(step)
        if stopped:
            return stopped
    return None


def _finish(trainer: Trainer, run: RunFolder, session: RunSession, result: TrainResult) -> None:
    """The result's figures, the final eval and the run's summary (a run that stopped early is evaluated when it
    ends)."""
    pace = session.pace
    result.steps, result.history = trainer.step, session.history
    result.examples_per_second = pace.steady_rate * session.train.train_batch_size
    result.seconds_to_first_step, result.compile_seconds = pace.seconds_to_first_step, pace.compile_seconds
    result.input_wait_share = pace.input_wait_share
    if not result.stopped_reason:
        result.final_eval = session.evaluate(result.steps, f"Final eval at step {result.steps}")
        result.nsp_note = nsp_majority_note(result.final_eval or {}, session.random_next_share())
    if not result.stopped_reason and trainer.is_chief:
        run.write_summary({"steps": result.steps, "initial_eval": result.initial_eval,
                           "final_eval": result.final_eval, "examples_per_second": result.examples_per_second,
                           "seconds_to_first_step": result.seconds_to_first_step,
                           "compile_seconds": result.compile_seconds, "input_wait_share": result.input_wait_share,
                           "train_seconds": pace.train_seconds, "accelerator": trainer.describe()})
    session.scalars.close()


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


def _resume(trainer: Trainer, run: RunFolder, manager: CheckpointManager, mirror: CheckpointMirror | None,
            set_aside_damaged: bool) -> dict:
    """Check the folder fits this run, restore its newest checkpoint, record the run, open the input at the
    restored step; returns the checkpoint's metadata (the seconds trained, the rate measured; empty when new)."""
    plan = trainer.plan
    identity = run_identity(plan.config, plan.model_config, plan.data)
    run.check_can_resume(identity)
    if mirror is not None:
        claim(mirror, identity)  # before a checkpoint is fetched from it: the copy must be this run's
    restored = manager.restore_latest(set_aside_damaged)
    _follow_schedule(trainer, restored.metadata.get("lr_schedule") if restored else None)
    if trainer.is_chief:  # the plan it follows from here (:func:`_follow_schedule`)
        run.write_run_files(trainer.plan.config, trainer.plan.model_config, trainer.plan.vocab)
        run.record_identity(identity)
    trainer.start_input(trainer.step)
    if restored is None:
        return {}
    log.info("Resuming from %s: step %d of %d.", restored.path, trainer.step, trainer.plan.config.train.num_train_steps)
    return restored.metadata


def _follow_schedule(trainer: Trainer, recorded: dict | None) -> None:
    """Place the schedule the run follows from the restored step (:meth:`.resolve.RunPlan.resumed`: a new plan)."""
    trainer.plan, change = trainer.plan.resumed(recorded, trainer.step)
    if change:
        log.warning("Learning rate: %s.", change)
    log.info("Learning rate: %s.", trainer.plan.schedule.describe())
    trainer.use_schedule(trainer.plan.schedule)


def _next_boundary(trainer: Trainer, step: int) -> int:
    """Where the call from ``step`` ends: the next step where something happens (log, eval, save, the end), at most
    one compiled call away."""
    t = trainer.plan.config.train
    total = t.num_train_steps

    def boundary(every: int) -> int:
        return min(total, (step // every + 1) * every) if every else total

    return min(boundary(t.log_every_steps), boundary(t.eval_every_steps), boundary(t.save_checkpoints_steps),
               step + trainer.steps_per_execution)
