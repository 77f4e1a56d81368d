"""Rebuild a trained model, for evaluation, the probe and export: a run's newest (or chosen) weights, or a
released checkpoint's.

Evaluation and export both start from "the model of this run", so the rebuild lives here: the run folder
says where its configuration, model shape, vocab and checkpoints are (:mod:`..core.run_folder`). A run is
rebuilt by the backend that trained it (``config.json``'s ``train.backend``), as a float32
:class:`..models.inference.InferenceModel`: a JAX run never loads TensorFlow. Weights come by Google name
(:mod:`..models.run_weights`); only a TensorFlow training checkpoint is restored by the TensorFlow model itself.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..backend import jax_installed, tensorflow_installed
from ..config import Config
from ..core.checkpoints import CheckpointError, checkpoint_name, find_checkpoint, list_checkpoints
from ..core.run_folder import RunFolder, trained_vocab_file
from ..environment import BERT4KERAS_VERSION
from ..errors import UserInputError
from ..models.bert_config import BertConfig, checkpoint_bert_config
from ..models.inference import InferenceModel
from ..models.modernbert_config import ModernBertConfig, is_modernbert_folder
from ..models.run_weights import (
    JAX,
    TENSORFLOW,
    checkpoint_format,
    has_nsp_weights,
    is_huggingface_folder,
    jax_checkpoint_folder,
    read_google_weights,
)
from ..models.tf_bundle import find_bundle_prefix, list_tensors

log = logging.getLogger(__name__)


@dataclass
class TrainedModel:
    """A rebuilt model with what is needed to use it: its vocab, casing and where its weights came from."""

    model: InferenceModel
    vocab_file: str
    do_lower_case: bool
    weights: str
    step: int | None = None
    run_dir: str | None = None
    config: Config | None = None
    untrained: list[str] = field(default_factory=list)  # Google names the weights' source lacked (random)

    @property
    def max_seq_length(self) -> int:
        return self.model.max_seq_length

    @property
    def max_predictions_per_seq(self) -> int:
        return self.model.max_predictions_per_seq

    def stored_weights(self) -> dict[str, np.ndarray]:
        """The weights by Google name, without those that were never trained (left random)."""
        return self.model.stored_weights(self.untrained)


def latest_weights(run_dir: str | os.PathLike, step: int | None = None) -> tuple[str, int] | None:
    """The newest whole checkpoint of a run (or the one at ``step``): (its ``state`` prefix, step), or None."""
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


def run_checkpoint(run: RunFolder, checkpoint: str | None) -> tuple[str, int | None]:
    """The weights a run is used with: ``checkpoint`` (a step, a folder or prefix) or its newest; (path, step)."""
    if checkpoint:
        _check_checkpoint_argument(run, str(checkpoint))
    if checkpoint and str(checkpoint).isdigit():  # a step number: that checkpoint of the run
        weights, step = latest_weights(run.path, int(checkpoint)) or (None, None)
    elif checkpoint:
        weights = str(checkpoint)
        match = re.search(r"ckpt-(\d+)", weights)
        step = int(match.group(1)) if match else None
    else:
        weights, step = latest_weights(run.path) or (None, None)
    if not weights:
        raise UserInputError(f"Run {run.path} has no whole checkpoint yet (checkpoints/): train first or pass "
                             "--checkpoint.")
    return weights, step


def _check_local(path: str | os.PathLike) -> None:
    if "://" in str(path):
        raise UserInputError(f"{path} is remote: download it first (`tpu-pretrain download {path} LOCAL_DIR`).")


def _check_checkpoint_argument(run: RunFolder, checkpoint: str) -> None:
    """Refuse a --checkpoint that names nothing, listing what the run holds."""
    is_step = checkpoint.isdigit() and (run.checkpoints / checkpoint_name(int(checkpoint))).is_dir()
    if is_step or Path(checkpoint).exists() or Path(checkpoint + ".index").is_file():
        return
    steps = [str(c.step) for c in list_checkpoints(run.checkpoints)]
    held = f"this run holds steps {', '.join(steps)}" if steps else "this run holds no checkpoint yet"
    raise UserInputError(f"--checkpoint {checkpoint}: no such step, folder or checkpoint ({held}). Give a step of the "
                         "run, a checkpoint folder or prefix, or a Hugging Face folder.")


# -- which backend, and its model -------------------------------------------------------------------------
def inference_backend(weights: str, trained_with: str | None = None, requested: str | None = None) -> str:
    """The backend that uses these weights: the one asked for, else the one that trained the run, else one installed.

    A TensorFlow training checkpoint needs TensorFlow (only its model maps the names); weights by Google
    name (a JAX checkpoint, a Hugging Face folder, a Google checkpoint) load into either backend.
    """
    if requested:
        if requested not in (TENSORFLOW, JAX):
            raise UserInputError(f"backend={requested!r}: choose tensorflow or jax (or leave it unset).")
        return requested
    stored = checkpoint_format(weights)
    if stored == TENSORFLOW:
        if not tensorflow_installed():
            raise UserInputError(
                f"{weights} is a checkpoint of the TensorFlow backend: reading it needs TensorFlow, tf-keras and "
                "bert4keras, which are not installed here. Export it where they are (`tpu-pretrain export RUN "
                "--format hf`) and use that folder here, or install them (make install).")
        return TENSORFLOW
    installed = {TENSORFLOW: tensorflow_installed(), JAX: jax_installed()}
    for backend in (trained_with or stored, TENSORFLOW, JAX):
        if backend and installed.get(backend):
            return backend
    raise UserInputError("Using a model needs a backend: pip install 'tpu_pretrain[jax]' (JAX and Keras 3) or "
                         f"'tpu_pretrain[cpu]' (TensorFlow), then pip install --no-deps "
                         f"bert4keras=={BERT4KERAS_VERSION}.")


def build_inference(backend: str, config: BertConfig | ModernBertConfig, max_seq_length: int,
                    max_predictions_per_seq: int, with_nsp: bool) -> InferenceModel:
    """A float32 model of ``backend`` (imported here, and only that backend); a ModernBERT is the JAX backend's."""
    if isinstance(config, ModernBertConfig) and backend != JAX:
        raise UserInputError(f"A ModernBERT is used with the JAX backend alone, not {backend}: pip install "
                             "'tpu_pretrain[jax]' (JAX and Keras 3), or leave --backend unset.")
    if backend == JAX:
        from ..jax_backend.inference import JaxInference

        return JaxInference.build(config, max_seq_length, max_predictions_per_seq, with_nsp)
    from ..tf_backend.inference import TfInference

    return TfInference.build(config, max_seq_length, max_predictions_per_seq, with_nsp)


def restore_weights(model: InferenceModel, weights: str) -> tuple[str, list[str]]:
    """Load a checkpoint into a built model: where the weights came from, and the Google names they lacked."""
    by_name = read_google_weights(weights)
    prefix = find_bundle_prefix(weights) if not is_huggingface_folder(weights) else None
    if by_name is None:  # a TensorFlow training checkpoint: only the TensorFlow model maps its names
        if model.backend != TENSORFLOW:
            raise UserInputError(f"{weights} is a checkpoint of the TensorFlow backend; the {model.backend} backend "
                                 "cannot read it. Export it with TensorFlow first (`tpu-pretrain export RUN`).")
        model.restore_object_checkpoint(prefix)  # TfInference's own, beyond the shared contract
        return prefix, []
    missing = model.load_stored_weights(by_name, str(weights))
    if missing:
        log.warning("%s lacks %d weights (%s...): they are random.", weights, len(missing), ", ".join(missing[:3]))
    folder = jax_checkpoint_folder(weights)
    return str(folder) if folder is not None else prefix or str(weights), missing


def run_google_weights(source: str | os.PathLike, checkpoint: str | None = None
                       ) -> tuple[dict[str, np.ndarray], BertConfig, str, bool]:
    """A run's newest (or chosen) weights by Google name, with its model shape, vocab file and casing.

    Read with NumPy wherever the format allows (no model built); a TensorFlow training checkpoint is the one
    case mapped through the TensorFlow model.
    """
    _check_local(source)
    run = RunFolder(source)
    config, model_config = run.read_config(), run.read_model_config()
    path, _ = run_checkpoint(run, checkpoint)
    with_nsp = not config.data.no_nsp
    weights = read_google_weights(path)
    if weights is None:
        inference_backend(path)  # says what to do where TensorFlow is not installed
        from ..tf_backend.inference import object_checkpoint_weights

        weights = object_checkpoint_weights(find_bundle_prefix(path), model_config, with_nsp)
    elif not with_nsp:  # what a model without the NSP branch would not take
        weights = {name: value for name, value in weights.items() if not has_nsp_weights([name])}
    return weights, model_config, trained_vocab_file(run, config), config.data.do_lower_case


def untrained_copy(trained: TrainedModel, seed: int = 0) -> TrainedModel:
    """The same model shape, vocab and casing with fresh random weights: the baseline pretraining must beat."""
    return TrainedModel(trained.model.fresh_copy(seed), trained.vocab_file, trained.do_lower_case,
                        "random initialisation", config=trained.config)


# -- runs and released checkpoints --------------------------------------------------------------------------
def load_trained_model(source: str | os.PathLike, checkpoint: str | None = None, *,
                       max_seq_length: int | None = None, max_predictions_per_seq: int | None = None,
                       do_lower_case: bool | None = None, backend: str | None = None) -> TrainedModel:
    """Rebuild the model of a run folder (newest or chosen weights), or of a Google/HF checkpoint.

    ``backend`` (``tensorflow`` or ``jax``) overrides the choice of :func:`inference_backend`.
    """
    _check_local(source)
    if checkpoint:
        _check_local(checkpoint)
    source = str(source)
    if not Path(source).exists() and not Path(source + ".index").is_file():
        raise UserInputError(f"{source} does not exist.")
    run = RunFolder(source)
    run.check_not_damaged()
    if run.is_run():
        config, model_config = run.read_config(), run.read_model_config()
        weights, step = run_checkpoint(run, checkpoint)
        model = build_inference(inference_backend(weights, run.recorded_backend(), backend), model_config,
                                max_seq_length or config.data.max_seq_length,
                                max_predictions_per_seq or config.data.max_predictions_per_seq, not config.data.no_nsp)
        if config.train.document_masks == "on" and hasattr(getattr(model, "model", None), "document_separator"):
            from ..jax_backend.input import separator_id  # the run kept documents apart: so does its model here

            model.model.document_separator = separator_id(model_config, trained_vocab_file(run, config))
        weights, untrained = restore_weights(model, weights)
        lower = config.data.do_lower_case if do_lower_case is None else do_lower_case
        return TrainedModel(model, trained_vocab_file(run, config), lower, weights, step, source, config, untrained)
    return _load_released(source, checkpoint, max_seq_length, max_predictions_per_seq, do_lower_case, backend)


def _load_released(source: str, checkpoint: str | None, max_seq_length: int | None,
                   max_predictions_per_seq: int | None, do_lower_case: bool | None,
                   backend: str | None) -> TrainedModel:
    """A Google or Hugging Face checkpoint with its bert_config.json/config.json and vocab.txt beside it."""
    weights = str(checkpoint or source)
    if is_modernbert_folder(weights):
        raise UserInputError(f"{weights} is a transformers ModernBERT folder: use it with transformers as it is, or "
                             f"continue pretraining it (train --model_family modernbert --init_checkpoint {weights}); "
                             "evaluate, probe and export take the runs of this tool.")
    model_config = checkpoint_bert_config(weights)
    if model_config is None:
        raise UserInputError(f"{source} is neither a run folder (config.json + bert_config.json) nor a checkpoint "
                             "with its bert_config.json/config.json beside it.")
    folder = Path(weights)
    folder = folder if folder.is_dir() else folder.parent
    vocab = folder / "vocab.txt"
    if not vocab.is_file():
        raise UserInputError(f"No vocab.txt next to {weights}.")
    with_nsp = _has_pooler(weights)  # the pooler lives in our NSP branch
    seq = max_seq_length or min(128, model_config.max_position_embeddings)
    model = build_inference(inference_backend(weights, requested=backend), model_config, seq,
                            max_predictions_per_seq or 20, with_nsp)
    weights, untrained = restore_weights(model, weights)
    lower = _checkpoint_lower_case(folder) if do_lower_case is None else do_lower_case
    return TrainedModel(model, str(vocab), lower, weights, untrained=untrained)


def _has_pooler(weights: str) -> bool:
    """Whether released weights hold a pooler (and so possibly NSP): read from the names, not the arrays."""
    p = Path(weights)
    if is_huggingface_folder(p) and (p / "model.safetensors").is_file():
        with open(p / "model.safetensors", "rb") as handle:
            header = json.loads(handle.read(int.from_bytes(handle.read(8), "little")))
        return any("pooler.dense" in name or "seq_relationship" in name for name in header)
    prefix = find_bundle_prefix(p)
    if prefix is None:
        return True  # pytorch_model.bin: BERT checkpoints nearly always carry the pooler
    return has_nsp_weights(list_tensors(prefix))


def _checkpoint_lower_case(folder: Path) -> bool:
    """Casing of a released checkpoint: its tokenizer_config.json, else the name (``cased``), else True."""
    config = folder / "tokenizer_config.json"
    if config.is_file():
        value = json.loads(config.read_text()).get("do_lower_case")
        if value is not None:
            return bool(value)
    return "cased" not in folder.name.lower() or "uncased" in folder.name.lower()
