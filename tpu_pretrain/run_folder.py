"""What a run folder remembers between sessions, and whether a new start may continue it.

Starting ``train`` again in the same folder resumes. That is only correct when the model, the
vocab, the data and the way batches are drawn are unchanged; those are recorded in ``run.json`` at
the first start and compared at every later one. Safe changes (total steps, the end learning rate,
logging and evaluation cadence, where checkpoints are mirrored) are allowed.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path

from .errors import UserInputError
from .storage.local import write_text_atomic

RUN_FILE = "run.json"
# Settings that change the model, the data or the order in which examples are drawn.
PINNED_SETTINGS = ("train_batch_size", "max_seq_length", "max_predictions_per_seq", "optimizer", "no_nsp",
                   "train_seed", "dynamic_masking", "shuffle_buffer_size")
UNPINNED_MODEL_FIELDS = ("hidden_dropout_prob", "attention_probs_dropout_prob")


def run_identity(config, bert_config, data_info) -> dict:
    """The facts a checkpoint of this run depends on."""
    model = {k: v for k, v in asdict(bert_config).items() if k not in UNPINNED_MODEL_FIELDS}
    manifest_path = Path(data_info.data_dir) / "manifest.json"
    data = {"train_instances": data_info.train_instances, "train_files": [os.path.basename(f) for f in
                                                                           data_info.train_files]}
    if manifest_path.is_file():
        manifest = json.loads(manifest_path.read_text())
        data["vocab_sha256"] = manifest.get("vocab_sha256")
        data["train_sha256"] = [s.get("sha256") for s in manifest.get("shards", []) if s.get("split") == "train"]
    return {"model": model, "data": data, "settings": {k: config.get(k) for k in PINNED_SETTINGS}}


def check_can_resume(run_dir: str | os.PathLike, identity: dict) -> None:
    """Refuse, naming every differing setting, when the run folder was made for something else."""
    path = Path(run_dir) / RUN_FILE
    if not path.is_file():
        return
    previous = json.loads(path.read_text())
    differences = []
    for key, value in identity["settings"].items():
        if previous["settings"].get(key) != value:
            differences.append(f"{key}: {previous['settings'].get(key)!r} in the run, {value!r} now")
    for key, value in identity["model"].items():
        if previous["model"].get(key) != value:
            differences.append(f"model {key}: {previous['model'].get(key)!r} in the run, {value!r} now")
    old_data, new_data = previous["data"], identity["data"]
    if old_data.get("vocab_sha256") != new_data.get("vocab_sha256"):
        differences.append("vocab: the data was made with a different vocab.txt")
    if (old_data.get("train_sha256") != new_data.get("train_sha256")
            or old_data.get("train_instances") != new_data.get("train_instances")):
        differences.append("data_dir: different training shards")
    if differences:
        raise UserInputError(
            f"Cannot continue the run in {run_dir}: its checkpoints were made with other settings "
            f"({'; '.join(differences)}). Restore those settings to continue, or use a new output_dir to "
            "start another run (an init_checkpoint can start it from this run's weights).")


def record_identity(run_dir: str | os.PathLike, identity: dict) -> None:
    path = Path(run_dir) / RUN_FILE
    if not path.is_file():
        write_text_atomic(path, json.dumps({**identity, "created": time.time()}, indent=2, sort_keys=True) + "\n")


def run_status(run_dir: str | os.PathLike) -> str:
    """Step reached, newest checkpoint and its mirror, time trained, and the estimated time left."""
    from . import storage
    from .checkpoints import CheckpointManager

    run_dir = Path(run_dir)
    if not (run_dir / "config.json").is_file():
        raise UserInputError(f"{run_dir} is not a run folder (no config.json): start it with `tpu-pretrain train`.")
    config = json.loads((run_dir / "config.json").read_text())
    total = config["train"]["num_train_steps"]
    mirror = config["storage"].get("mirror_dir", "")
    manager = CheckpointManager(run_dir, checkpoint=None, mirror=mirror or None)
    newest = next((c for c in manager.local_checkpoints() if manager.verify(c) is None), None)
    lines = [f"run: {run_dir.resolve()}"]
    if newest is None:
        lines.append(f"no checkpoint yet (0 of {total} steps)")
        return "\n".join(lines)
    meta = newest.metadata
    lines.append(f"step {newest.step} of {total} ({newest.step / total:.1%})")
    lines.append(f"newest checkpoint: {newest.path}")
    if mirror:
        try:
            mirrored = storage.exists(storage.join(mirror, "checkpoints", newest.name, "checkpoint.json"))
            where = storage.join(mirror, "checkpoints", newest.name)
            lines.append(f"mirror: {where} ({'complete' if mirrored else 'not there yet'})")
        except Exception as exc:  # the mirror may be unreachable from here
            lines.append(f"mirror: {mirror} (cannot be checked: {exc})")
    else:
        lines.append("mirror: none (set mirror_dir to a Drive folder or gs:// URL)")
    seconds = meta.get("train_seconds", 0.0)
    lines.append(f"time trained: {_hms(seconds)}")
    rate = meta.get("steps_per_second") or (newest.step / seconds if seconds else 0)
    if rate and newest.step < total:
        lines.append(f"estimated time left: {_hms((total - newest.step) / rate)} at {rate:.2f} steps/s")
    elif newest.step >= total:
        lines.append("finished")
    return "\n".join(lines)


def _hms(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m{seconds % 60:02d}s"
