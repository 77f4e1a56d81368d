"""Rebuild a trained model, for evaluation and export: a run's newest (or chosen) weights, or a released
checkpoint's.

Evaluation and export both start from "the model of this run", so the rebuild lives here: the run folder
says where its configuration, model shape, vocab and checkpoints are (:mod:`..core.run_folder`), and
the weights are restored into a float32 model whatever precision training used.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..config import Config
from ..core.bert_config import BertConfig, checkpoint_bert_config
from ..core.checkpoints import CheckpointError, checkpoint_name, find_checkpoint, list_checkpoints
from ..core.run_folder import RunFolder, trained_vocab_file
from ..core.weight_names import HF_WEIGHT_FILES, tf_checkpoint_prefix
from ..environment import import_tensorflow
from ..errors import UserInputError
from ..jax_backend.state import is_jax_checkpoint, read_weights
from ..tf_backend.model import PretrainingModel, build_pretraining_model
from ..tf_backend.weights import has_pooler, load_google_weights, load_init_checkpoint

tf = import_tensorflow()  # with TensorFlow's C++ start-up noise filtered out

log = logging.getLogger(__name__)
OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"


@dataclass
class TrainedModel:
    """A rebuilt model with what is needed to use it: its vocab, casing and where its weights came from."""

    pretraining: PretrainingModel
    vocab_file: str
    do_lower_case: bool
    weights: str
    step: int | None = None
    run_dir: str | None = None
    config: Config | None = None
    untrained: list[str] = field(default_factory=list)  # Google names the weights' source lacked (random)

    @property
    def max_seq_length(self) -> int:
        return int(self.pretraining.model.inputs[0].shape[1])

    @property
    def max_predictions_per_seq(self) -> int:
        return int(self.pretraining.model.inputs[2].shape[1])


def latest_weights(run_dir: str | os.PathLike, step: int | None = None) -> tuple[str, int] | None:
    """The newest whole checkpoint of a run (or the one at ``step``): (TF prefix, step), or None."""
    checkpoints = RunFolder(run_dir).checkpoints
    if not checkpoints.is_dir():
        return None
    try:
        info = find_checkpoint(checkpoints, step)
    except CheckpointError:
        if step is not None:
            raise
        return None
    return info.tf_prefix, info.step


def _check_local(path: str | os.PathLike) -> None:
    if "://" in str(path):
        raise UserInputError(f"{path} is remote: download it first (`tpu-pretrain download {path} LOCAL_DIR`).")


def restore_weights(pretraining: PretrainingModel, weights: str) -> tuple[str, list[str]]:
    """Load weights into a built model: a run checkpoint (object-based) or Google/Hugging Face weights.

    A JAX backend checkpoint (``state.npz``) loads by Google name. Returns where they came from
    and the Google names of model weights the source lacked (left random).
    """
    p = Path(weights)
    jax_folder = next((f for f in (p, p.parent) if is_jax_checkpoint(f)), None)
    if jax_folder is not None:  # a run trained by the JAX backend: its weights by Google name
        load_google_weights(pretraining, read_weights(jax_folder), str(jax_folder))
        return str(jax_folder), []
    is_hf = p.is_dir() and any((p / n).is_file() for n in HF_WEIGHT_FILES)
    prefix = None if is_hf else tf_checkpoint_prefix(p)
    if prefix is not None and OBJECT_GRAPH_KEY in tf.train.load_checkpoint(prefix).get_variable_to_shape_map():
        status = tf.train.Checkpoint(model=pretraining.model).read(prefix)
        status.assert_existing_objects_matched()
        status.expect_partial()  # a full training checkpoint also holds optimizer state and data position
        return prefix, []
    report = load_init_checkpoint(pretraining, weights)
    if report.missing:
        log.warning("%s lacks %d weights (%s...): they are random.", weights, len(report.missing),
                    ", ".join(report.missing[:3]))
    return prefix or str(weights), report.missing


def _check_checkpoint_argument(run: RunFolder, checkpoint: str) -> None:
    """Refuse a --checkpoint that names nothing, listing what the run holds."""
    is_step = checkpoint.isdigit() and (run.checkpoints / checkpoint_name(int(checkpoint))).is_dir()
    if is_step or Path(checkpoint).exists() or Path(checkpoint + ".index").is_file():
        return
    steps = [str(c.step) for c in list_checkpoints(run.checkpoints)]
    held = f"this run holds steps {', '.join(steps)}" if steps else "this run holds no checkpoint yet"
    raise UserInputError(f"--checkpoint {checkpoint}: no such step, folder or checkpoint ({held}). Give a step of the "
                         "run, a checkpoint folder or prefix, or a Hugging Face folder.")


def _build_float32(config: BertConfig, max_seq_length: int, max_predictions: int, with_nsp: bool):
    """Build in float32 whatever global mixed-precision policy training left behind."""
    policy = tf.keras.mixed_precision.global_policy()
    tf.keras.mixed_precision.set_global_policy("float32")
    try:
        return build_pretraining_model(config, max_seq_length, max_predictions, with_nsp)
    finally:
        tf.keras.mixed_precision.set_global_policy(policy)


def untrained_copy(trained: TrainedModel, seed: int = 0) -> TrainedModel:
    """The same model shape, vocab and casing with fresh random weights: the baseline pretraining must beat."""
    tf.keras.utils.set_random_seed(seed)
    pretraining = _build_float32(trained.pretraining.config, trained.max_seq_length,
                                 trained.max_predictions_per_seq, trained.pretraining.with_nsp)
    return TrainedModel(pretraining, trained.vocab_file, trained.do_lower_case, "random initialisation",
                        config=trained.config)


def load_trained_model(source: str | os.PathLike, checkpoint: str | None = None, *,
                       max_seq_length: int | None = None, max_predictions_per_seq: int | None = None,
                       do_lower_case: bool | None = None) -> TrainedModel:
    """Rebuild the model of a run folder (newest or chosen weights), or of a Google/HF checkpoint."""
    _check_local(source)
    if checkpoint:
        _check_local(checkpoint)
    source = str(source)
    if not Path(source).exists() and not Path(source + ".index").is_file():
        raise UserInputError(f"{source} does not exist.")
    run = RunFolder(source)
    run.check_not_damaged()
    if run.is_run():
        config = run.read_config()
        bert_config = run.read_bert_config()
        step = None
        if checkpoint:
            _check_checkpoint_argument(run, str(checkpoint))
        if checkpoint and str(checkpoint).isdigit():  # a step number: that checkpoint of the run
            weights, step = latest_weights(source, int(checkpoint)) or (None, None)
        elif checkpoint:
            weights = checkpoint
            match = re.search(r"ckpt-(\d+)", str(checkpoint))
            step = int(match.group(1)) if match else None
        else:
            weights, step = latest_weights(source) or (None, None)
        if not weights:
            raise UserInputError(f"Run {source} has no whole checkpoint yet (checkpoints/): train first or pass "
                                 "--checkpoint.")
        pretraining = _build_float32(bert_config, max_seq_length or config.data.max_seq_length,
                                     max_predictions_per_seq or config.data.max_predictions_per_seq,
                                     not config.data.no_nsp)
        weights, untrained = restore_weights(pretraining, weights)
        lower = config.data.do_lower_case if do_lower_case is None else do_lower_case
        return TrainedModel(pretraining, trained_vocab_file(run, config), lower, weights,
                            step, source, config, untrained)
    bert_config = checkpoint_bert_config(checkpoint or source)
    if bert_config is None:
        raise UserInputError(f"{source} is neither a run folder (config.json + bert_config.json) nor a checkpoint "
                             "with its bert_config.json/config.json beside it.")
    folder = Path(checkpoint or source)
    folder = folder if folder.is_dir() else folder.parent
    vocab = folder / "vocab.txt"
    if not vocab.is_file():
        raise UserInputError(f"No vocab.txt next to {checkpoint or source}.")
    with_nsp = has_pooler(Path(checkpoint or source))  # the pooler lives in our NSP branch
    seq = max_seq_length or min(128, bert_config.max_position_embeddings)
    pretraining = _build_float32(bert_config, seq, max_predictions_per_seq or 20, with_nsp)
    weights, untrained = restore_weights(pretraining, str(checkpoint or source))
    lower = _checkpoint_lower_case(folder) if do_lower_case is None else do_lower_case
    return TrainedModel(pretraining, str(vocab), lower, weights, untrained=untrained)


def _checkpoint_lower_case(folder: Path) -> bool:
    """Casing of a released checkpoint: its tokenizer_config.json, else the name (``cased``), else True."""
    config = folder / "tokenizer_config.json"
    if config.is_file():
        value = json.loads(config.read_text()).get("do_lower_case")
        if value is not None:
            return bool(value)
    return "cased" not in folder.name.lower() or "uncased" in folder.name.lower()
