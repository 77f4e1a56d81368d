"""The model families the JAX backend trains, and the one place that picks between them.

``bert``: :class:`.model.PretrainingBert`, its weights named and stored as Google's checkpoints name and store
them (Google names, Dense kernels ``[in, out]``). ``modernbert``: :class:`.modernbert.PretrainingModernBert`, its
weights named and stored as transformers' ``ModernBertForMaskedLM`` state dict has them (Linear kernels ``[out,
in]``), so a ModernBERT checkpoint's ``params/`` are a transformers folder's weights as they are. The trainer, the
inference model and the checkpoints ask a :class:`Family` for the model, the names and the layout; which family a
run is comes from the type of its model config (:class:`..core.bert_config.BertConfig` or
:class:`..core.modernbert_config.ModernBertConfig`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..core.modernbert_config import ModernBertConfig
from ..core.run_weights import jax_checkpoint_folder, read_weights
from ..core.weight_names import read_checkpoint_weights, read_modernbert_folder
from . import modernbert
from .model import assign_google_weights, build_model, from_google, google_variables, google_weights, to_google


@dataclass(frozen=True)
class Family:
    """How one family's model is built, and its weights named, stored and read from a released checkpoint."""

    name: str
    what: str  # for messages: BERT, ModernBERT
    build: Callable  # (config, max_seq_length, max_predictions_per_seq, with_nsp, dtype) -> Keras model
    variables: Callable  # model -> {stored name: keras.Variable}
    to_stored: Callable  # (name, the variable's value) -> the array as stored
    from_stored: Callable  # (name, a stored array) -> the variable's value
    assign: Callable  # (model, weights by stored name, source) -> (loaded, missing) names
    stored_weights: Callable  # model -> {stored name: float32 array}
    read_init: Callable  # init_checkpoint path -> {stored name: array}

    def weights(self, model, skip=()) -> dict[str, np.ndarray]:
        """Every weight of a built model by stored name and layout (float32), but those in ``skip``."""
        return {name: value for name, value in self.stored_weights(model).items() if name not in skip}


def _read_modernbert_init(path: str) -> dict[str, np.ndarray]:
    """A ModernBERT's weights by transformers' names: a transformers folder, or a ModernBERT run's checkpoint."""
    folder = jax_checkpoint_folder(path)
    if folder is not None:
        return read_weights(folder)
    return read_modernbert_folder(path)[1]


def _build_modernbert(config, max_seq_length, max_predictions_per_seq, with_nsp=False, dtype=None):
    return modernbert.build_modernbert(config, max_seq_length, max_predictions_per_seq, dtype=dtype)


BERT = Family("bert", "BERT", build_model, google_variables, to_google, from_google, assign_google_weights,
              google_weights, read_checkpoint_weights)
MODERNBERT = Family("modernbert", "ModernBERT", _build_modernbert, modernbert.hf_variables, modernbert.to_hf,
                    modernbert.to_hf, modernbert.assign_hf_weights, modernbert.hf_weights, _read_modernbert_init)


def family_of(config) -> Family:
    """The family of a model config: ModernBERT's config gives :data:`MODERNBERT`, BERT's :data:`BERT`."""
    return MODERNBERT if isinstance(config, ModernBertConfig) else BERT
