"""Did pretraining work? Held-out MLM/NSP figures and fill-mask examples for a run's weights.

``evaluate(RUN)`` restores the newest (or a chosen) checkpoint, computes MLM loss, accuracy and
perplexity and NSP accuracy over the eval shards with the same formulas as training's periodic eval,
fills ``[MASK]`` slots in sentences the user gives (top k, with probabilities, whole words shown),
and writes it all to ``RUN/evaluation.json``. The model is the backend's that trained the run
(:mod:`.rebuild`); the eval records are read with NumPy, the same batches for either backend.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..core.metrics import add_sums, eval_random_next_share, metrics_from_sums, nsp_majority_note
from ..core.run_folder import EVALUATION, RunFolder
from ..data.data_folder import EVAL, corrupt_shard_error, feature_shapes, read_data_info
from ..data.tfrecord import CorruptRecord, decode_examples, read_records
from ..errors import UserInputError
from ..storage.local import check_writable_folder, disk_full_said, write_text_atomic
from .fill_mask import fill_mask, format_fill_mask
from .rebuild import TrainedModel, load_trained_model

log = logging.getLogger(__name__)


@dataclass
class EvalResult:
    """Figures on the eval shards, fill-mask predictions, and which weights they describe."""

    weights: str
    step: int | None
    metrics: dict | None
    eval_examples: int
    fill_mask: list[dict] = field(default_factory=list)
    data_dir: str | None = None
    seconds: float = 0.0
    path: str | None = None

    def summary(self) -> str:
        where = f"step {self.step}" if self.step is not None else self.weights
        lines = [f"Evaluation of {where}"]
        if self.metrics:
            m = self.metrics
            text = (f"  eval ({self.eval_examples} sequences): MLM loss {m['mlm_loss']:.4f}, accuracy "
                    f"{m['mlm_accuracy']:.4f}, perplexity {m['mlm_perplexity']:.2f}")
            if "nsp_accuracy" in m:
                note = nsp_majority_note(m, eval_random_next_share(self.data_dir))
                text += f"; NSP accuracy {m['nsp_accuracy']:.4f}{note}"
            lines.append(text)
        else:
            lines.append("  no eval shards: figures skipped" if self.data_dir else
                         "  no data folder here: held-out figures skipped")
        lines += [format_fill_mask(item) for item in self.fill_mask]
        if self.path:
            lines.append(f"  written to {self.path}")
        return "\n".join(lines)


# -- held-out figures -------------------------------------------------------------------------------
def eval_batches(files: list[str], batch_size: int, max_seq_length: int, max_predictions_per_seq: int,
                 max_batches: int | None = None):
    """The records of ``files`` (in name order) in batches of ``batch_size``, the last one shorter, at most
    ``max_batches``: int32 features (``next_sentence_labels`` a vector), as both backends' models take them."""
    shapes = feature_shapes(max_seq_length, max_predictions_per_seq)

    def batch(records):
        features = decode_examples(records, shapes)
        out = {k: v.astype(np.int32) if v.dtype == np.int64 else v for k, v in features.items()}
        out["next_sentence_labels"] = out["next_sentence_labels"].reshape(-1)
        return out

    pending, made = [], 0
    for path in sorted(files):
        try:
            for record in read_records(path):
                pending.append(record)
                if len(pending) == batch_size:
                    yield batch(pending)
                    pending, made = [], made + 1
                    if max_batches and made >= max_batches:
                        return
        except CorruptRecord as exc:
            raise corrupt_shard_error(os.path.dirname(path), exc) from None
    if pending:
        yield batch(pending)


def eval_sums(trained: TrainedModel, files: list[str], batch_size: int, max_batches: int | None) -> dict:
    """Summed MLM/NSP statistics over the records of ``files`` (every record, last batch included)."""
    totals: dict = {}
    for batch in eval_batches(files, batch_size, trained.max_seq_length, trained.max_predictions_per_seq,
                              max_batches):
        totals = add_sums(totals, trained.model.batch_stats(batch))
    return totals


def held_out_metrics(trained: TrainedModel, data_dir: str, batch_size: int | None,
                     max_eval_steps: int | None) -> tuple[dict | None, int]:
    """(metrics, eval sequences read) on a data folder's eval shards; (None, 0) when there are none."""
    info = read_data_info(data_dir, splits=(EVAL,))  # the training shards need not be here
    if (info.max_seq_length, info.max_predictions_per_seq) != (trained.max_seq_length,
                                                               trained.max_predictions_per_seq):
        raise UserInputError(f"The data in {data_dir} has max_seq_length={info.max_seq_length}, "
                             f"max_predictions_per_seq={info.max_predictions_per_seq}; the run was trained on "
                             f"{trained.max_seq_length}, {trained.max_predictions_per_seq}.")
    if not info.eval_files:
        log.warning("%s has no eval shards (create-data --eval_fraction): figures skipped.", data_dir)
        return None, 0
    t = trained.config.train if trained.config else None
    batch = batch_size or (t.eval_batch_size or t.train_batch_size if t else 32)
    steps = (t.max_eval_steps if t else 100) if max_eval_steps is None else max_eval_steps
    sums = eval_sums(trained, info.eval_files, batch, steps or None)
    examples = int(sums.get("examples", 0))
    return ({**metrics_from_sums(sums), "sequences": examples} if examples else None), examples


# -- the whole evaluation -------------------------------------------------------------------------------
def evaluate(run_dir: str | os.PathLike, checkpoint: str | None = None, *, sentences=(), top_k: int = 5,
             data_dir: str | None = None, max_eval_steps: int | None = None, eval_batch_size: int | None = None,
             output: str | os.PathLike | None = None, trained: TrainedModel | None = None,
             backend: str | None = None) -> EvalResult:
    """Evaluate a run's newest (or the given) weights on its eval shards; fill masks; write evaluation.json.

    ``data_dir``, ``max_eval_steps`` and ``eval_batch_size`` default to the run's configuration;
    ``max_eval_steps=0`` reads every eval record. A run brought to a new runtime without its data
    folder still gets its fill-mask predictions (the figures are skipped, saying so). ``backend``
    overrides the backend that trained the run (:func:`.rebuild.inference_backend`).
    """
    started = time.perf_counter()
    if output is not None:  # checked before the slow work
        output = evaluation_file(output)
        check_writable_folder(output.parent, "--output")
    trained = trained or load_trained_model(run_dir, checkpoint, backend=backend)
    configured = trained.config.storage.data_dir if trained.config else None
    data_dir = data_dir or configured
    metrics, examples = None, 0
    if data_dir and not data_dir.startswith("gs://") and not os.path.isdir(data_dir) and data_dir == configured:
        log.warning("The run's data folder %s is not on this machine: held-out figures skipped (pass --data_dir "
                    "with a local copy of the data to compute them).", data_dir)
        data_dir = None
    if data_dir:
        metrics, examples = held_out_metrics(trained, data_dir, eval_batch_size, max_eval_steps)
    result = EvalResult(trained.weights, trained.step, metrics, examples,
                        fill_mask(trained, list(sentences), top_k) if sentences else [],
                        str(data_dir) if data_dir else None)
    result.seconds = time.perf_counter() - started
    if output is None and trained.run_dir:
        output = RunFolder(trained.run_dir).evaluation_file
    if output is not None:
        result.path = str(output)
        with disk_full_said(output):
            write_text_atomic(output, json.dumps(_jsonable(asdict(result)), indent=2, ensure_ascii=False) + "\n")
    return result


def evaluation_file(output: str | os.PathLike) -> Path:
    """The file ``--output`` names: NAME.json itself; a folder, or a new name without .json (a folder then, made),
    gets evaluation.json inside, so blimp.json beside it lands there too, not in the current folder. An existing
    file of another kind is refused: it is not this tool's to replace."""
    path = Path(output)
    if path.suffix.lower() == ".json" and not path.is_dir():
        return path
    if path.exists() and not path.is_dir():
        raise UserInputError(f"--output {path} is a file, not a results .json: give a folder (evaluation.json goes "
                             "inside) or a NAME.json; the file was left alone.")
    return path / EVALUATION


def _jsonable(value):
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
