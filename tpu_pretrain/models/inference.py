"""What evaluation, fill-mask, the probe and export need of a trained model: the contract both backends implement.

Each backend builds its own model and fills it with weights given by Google BERT name (the hub every
checkpoint format is read into, :mod:`.run_weights`; a ModernBERT, the JAX backend's alone, by transformers'
names), so ``export/`` works on any run without knowing which backend trained it, and a run is used by the
backend that trained it: a JAX run never needs TensorFlow.
Arrays in and out are NumPy; the statistics are :mod:`..core.metrics`'s sums, the same formula in both backends.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from .bert_config import BertConfig
from .modernbert_config import ModernBertConfig


class InferenceModel(Protocol):
    """A float32 BERT with its pretraining heads, static shapes ``[batch, max_seq_length]``."""

    backend: str  # "tensorflow" or "jax"
    config: BertConfig | ModernBertConfig
    with_nsp: bool
    max_seq_length: int
    max_predictions_per_seq: int

    def load_stored_weights(self, weights: dict[str, np.ndarray], source: str) -> list[str]: ...  # -> missing names

    def stored_weights(self, skip=()) -> dict[str, np.ndarray]: ...  # every weight but ``skip``, as Google stores it

    def outputs(self, input_ids, segment_ids, positions) -> list[np.ndarray]: ...  # [mlm_logits(, nsp_logits)]

    def batch_stats(self, batch: dict) -> dict: ...  # summed statistics of a batch (:func:`.metrics.pretraining_stats`)

    def hidden_states(self, input_ids, segment_ids) -> np.ndarray: ...  # last hidden states [batch, length, hidden]

    def fresh_copy(self, seed: int) -> InferenceModel: ...  # the same shape from random initialisation

    def finetune_accuracy(self, train, test, num_labels: int, epochs: int, learning_rate: float, seed: int,
                          batch_size: int) -> float: ...  # the probe's fine-tuning: held-out accuracy
