"""The TensorFlow model's weights by Google's names, and released checkpoints loaded into it.

Google's BERT names (``bert/encoder/layer_0/attention/self/query/kernel``) are the hub: bert4keras's
``variable_mapping`` maps the model's layers to them; the renaming to and from Hugging Face names and
the safetensors format (no TensorFlow needed) live in :mod:`..models.weight_names`.
"""

from __future__ import annotations

import json
import logging
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import UserInputError
from ..models.weight_names import NSP_WEIGHTS, read_checkpoint_weights, tf_checkpoint_prefix
from .framework import tf
from .model import PretrainingModel

log = logging.getLogger(__name__)


def google_weights(pretraining: PretrainingModel, skip=()) -> dict[str, np.ndarray]:
    """Every weight of the model under its original Google BERT checkpoint name (but those in ``skip``)."""
    bert = pretraining.bert
    out, skip = {}, set(skip)
    for layer_name, names in bert.variable_mapping().items():
        if layer_name not in bert.layers:
            continue
        for variable, name in zip(bert.layers[layer_name].trainable_weights, names, strict=False):
            if name in skip:
                continue
            value = np.asarray(variable.numpy(), dtype=np.float32)
            out[name] = value.T if name == NSP_WEIGHTS else value  # Google stores it [2, hidden]
    return out


@dataclass
class InitReport:
    """What an init checkpoint provided: loaded and missing variables (Google names)."""

    source: str
    loaded: list[str]
    missing: list[str]

    def summary(self) -> str:
        text = f"Initialised {len(self.loaded)} weights from {self.source}"
        if self.missing:
            text += f"; {len(self.missing)} not in it keep their random init: {', '.join(self.missing[:6])}"
            text += " ..." if len(self.missing) > 6 else ""
        return text


def load_init_checkpoint(pretraining: PretrainingModel, init_checkpoint: str) -> InitReport:
    """Load a Google TF checkpoint (``bert/encoder/layer_N/...``) or a Hugging Face BERT folder."""
    return load_google_weights(pretraining, read_checkpoint_weights(init_checkpoint), init_checkpoint)


def load_google_weights(pretraining: PretrainingModel, weights: dict[str, np.ndarray], source: str) -> InitReport:
    """Assign weights given by Google BERT name (from any checkpoint or backend) to the model's variables."""
    bert = pretraining.bert
    loaded, missing, pairs = [], [], []
    for layer_name, names in bert.variable_mapping().items():
        if layer_name not in bert.layers:
            continue
        for variable, name in zip(bert.layers[layer_name].trainable_weights, names, strict=False):
            if name not in weights:
                missing.append(name)
                continue
            value = bert.load_variable(weights, name)
            if tuple(value.shape) != tuple(variable.shape):
                raise UserInputError(
                    f"init_checkpoint {source}: {name} has shape {tuple(value.shape)} but the model "
                    f"needs {tuple(variable.shape)}; build the model from the checkpoint's own config "
                    "(leave model_size and bert_config_file empty, or use its bert_config.json)."
                )
            pairs.append((variable, value))
            loaded.append(name)
    if not loaded:
        raise UserInputError(f"init_checkpoint {source} holds no BERT weights that this model uses.")
    for variable, value in pairs:
        variable.assign(value.astype(variable.dtype.as_numpy_dtype))
    report = InitReport(source, loaded, missing)
    log.info(report.summary())
    return report


def has_pooler(path: Path) -> bool:
    """Whether released weights hold a pooler (and so possibly NSP): read from the names, not the arrays."""
    if path.is_dir() and (path / "model.safetensors").is_file():
        with open(path / "model.safetensors", "rb") as handle:
            header = json.loads(handle.read(struct.unpack("<Q", handle.read(8))[0]))
        return any("pooler.dense" in name or "seq_relationship" in name for name in header)
    prefix = tf_checkpoint_prefix(path)
    if prefix is None:
        return True  # pytorch_model.bin: BERT checkpoints nearly always carry the pooler
    names = [name for name, _ in tf.train.list_variables(prefix)]
    return any(name.startswith(("bert/pooler/", "cls/seq_relationship/")) for name in names)
