"""Where a run stands: ``tpu-pretrain status RUN``."""

from __future__ import annotations

import os

from ..formatting import hms
from .checkpoints import DAMAGED, list_checkpoints, verify
from .mirror import CAUSES, CheckpointMirror, mirror_state
from .run_folder import RunFolder
from .run_lock import trainer_line


def run_status(run_dir: str | os.PathLike) -> str:
    """Step reached, newest checkpoint and its mirror, time trained, and the estimated time left."""
    run = RunFolder(run_dir)
    config = run.read_config()
    total = config.train.num_train_steps
    mirror = config.storage.mirror_dir
    checked = [(c, verify(c)) for c in list_checkpoints(run.checkpoints)]
    newest = next((c for c, problem in checked if problem is None), None)
    damaged = [f"{c.name} ({problem})" for c, problem in checked if problem is not None]
    lines = [f"run: {run.path.resolve()}", trainer_line(run.lock_file)]
    if damaged:
        lines.append(f"damaged checkpoints: {'; '.join(damaged)}")
    set_aside = sorted(p.name for p in (run.checkpoints / DAMAGED).glob("*")) if run.checkpoints.is_dir() else []
    if set_aside:
        lines.append(f"set aside as damaged earlier, in {run.checkpoints / DAMAGED}: {', '.join(set_aside)}")
    if newest is None and damaged:
        lines.append(f"no whole checkpoint: `train` refuses to start over the damaged ones (0 of {total} steps "
                     "usable; see its --set_aside_damaged_checkpoints)")
        return "\n".join(lines)
    if newest is None:
        lines.append(f"no checkpoint yet (0 of {total} steps)")
        return "\n".join(lines)
    lines.append(f"step {newest.step} of {total} ({newest.step / total:.1%})")
    lines.append(f"newest checkpoint: {newest.path}")
    if mirror:
        lines.append(durable_copy(run, mirror, newest.step))
    else:
        lines.append("mirror: none (set mirror_dir to a Drive folder or gs:// URL)")
    seconds = newest.metadata.get("train_seconds", 0.0)
    lines.append(f"time trained: {hms(seconds)}")
    rate = newest.metadata.get("steps_per_second") or (newest.step / seconds if seconds else 0)
    if rate:
        sequences = rate * config.train.train_batch_size
        mfu = newest.metadata.get("mfu")
        lines.append(f"speed: {rate:.2f} steps/s, {sequences:,.1f} sequences/s, "
                     f"{sequences * config.data.max_seq_length:,.0f} tokens/s"
                     + (f", MFU {mfu:.1%}" if mfu is not None else ""))
    if rate and newest.step < total:
        lines.append(f"estimated time left: {hms((total - newest.step) / rate)} at {rate:.2f} steps/s")
    elif newest.step >= total:
        lines.append("finished")
    return "\n".join(lines)


def durable_copy(run: RunFolder, url: str, local_step: int) -> str:
    """Where the durable copy stands against the newest local checkpoint, and its last failure if any."""
    state = mirror_state(run)
    state = state if state and state.get("url") == url else None
    copy = CheckpointMirror(run, url)
    try:
        durable = copy.complete_steps()
        newest = durable[-1] if durable else None
        line = f"durable copy: {url}, " + _lag(run, newest, local_step)
    except Exception as exc:  # the copy may be unreachable from here: what training last saw of it
        line = f"durable copy: {url} (cannot be checked from here: {exc})"
        if state:
            line += f"; as training last saw it: {_lag(run, state.get('durable_step'), local_step)}"
    finally:
        copy.close()
    if state and state.get("error"):
        line += f"; its last attempt failed ({CAUSES.get(state.get('cause'), 'see the message')}): {state['error']}"
    return line


def _lag(run: RunFolder, durable: int | None, local_step: int) -> str:
    newer = [c.step for c in list_checkpoints(run.checkpoints) if durable is None or c.step > durable]
    if durable is not None and not newer:
        return f"current (step {durable})"
    there = f"step {durable}" if durable is not None else "no complete checkpoint yet"
    return (f"{there}: behind the newest local checkpoint (step {local_step}) by {local_step - (durable or 0)} steps, "
            f"{len(newer)} checkpoint(s) here")
