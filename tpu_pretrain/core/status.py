"""Where a run stands: ``tpu-pretrain status RUN``."""

from __future__ import annotations

import os

from .. import storage
from ..formatting import hms
from .checkpoints import DAMAGED, list_checkpoints, verify
from .mirror import CheckpointMirror
from .run_folder import RunFolder


def run_status(run_dir: str | os.PathLike) -> str:
    """Step reached, newest checkpoint and its mirror, time trained, and the estimated time left."""
    run = RunFolder(run_dir)
    config = run.read_config()
    total = config.train.num_train_steps
    mirror = config.storage.mirror_dir
    checked = [(c, verify(c)) for c in list_checkpoints(run.checkpoints)]
    newest = next((c for c, problem in checked if problem is None), None)
    damaged = [f"{c.name} ({problem})" for c, problem in checked if problem is not None]
    lines = [f"run: {run.path.resolve()}"]
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
        copy = CheckpointMirror(run, mirror)
        try:
            where = storage.join(copy.checkpoints_url, newest.name)
            lines.append(f"mirror: {where} ({'complete' if copy.holds(newest.name) else 'not there yet'})")
        except Exception as exc:  # the mirror may be unreachable from here
            lines.append(f"mirror: {mirror} (cannot be checked: {exc})")
        finally:
            copy.close()
    else:
        lines.append("mirror: none (set mirror_dir to a Drive folder or gs:// URL)")
    seconds = newest.metadata.get("train_seconds", 0.0)
    lines.append(f"time trained: {hms(seconds)}")
    rate = newest.metadata.get("steps_per_second") or (newest.step / seconds if seconds else 0)
    if rate and newest.step < total:
        lines.append(f"estimated time left: {hms((total - newest.step) / rate)} at {rate:.2f} steps/s")
    elif newest.step >= total:
        lines.append("finished")
    return "\n".join(lines)
