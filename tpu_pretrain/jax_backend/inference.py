"""The JAX backend's half of :class:`..models.inference.InferenceModel`: a run used without TensorFlow.

The Keras 3 model of :mod:`.model` (or :mod:`.modernbert`: :mod:`.families` picks by the config), in float32,
filled with weights by Google name (a ModernBERT's by transformers' names, as its run stores them); its logits, batch
statistics (:func:`.step.pretraining_stats`, the core's formula) and hidden states come from functions compiled once per
shape with ``jax.jit``, the weights passed in as arguments (not baked into the program as constants). The
probe's fine-tuning trains the encoder with a linear head through Keras's own ``fit``.
"""

from __future__ import annotations

import numpy as np

from . import select_keras_backend

select_keras_backend()

import jax  # noqa: E402
import keras  # noqa: E402
from keras import ops  # noqa: E402

from ..models.bert_config import BertConfig  # noqa: E402
from ..models.modernbert_config import ModernBertConfig  # noqa: E402
from ..models.run_weights import JAX  # noqa: E402
from .families import jax_family  # noqa: E402
from .model import PretrainingBert  # noqa: E402
from .step import pretraining_stats  # noqa: E402

MODEL_INPUTS = ("input_ids", "segment_ids", "masked_lm_positions")
ENCODE_BATCH = 64  # rows per hidden-states call: every call one compiled shape (the last one padded)


class JaxInference:
    """A float32 :class:`.model.PretrainingBert` as evaluation, fill-mask, the probe and export use it."""

    backend = JAX

    def __init__(self, model: PretrainingBert, max_seq_length: int, max_predictions_per_seq: int):
        self.model, self.config, self.with_nsp = model, model.config, model.with_nsp
        self.family = jax_family(model.config)
        self.max_seq_length, self.max_predictions_per_seq = max_seq_length, max_predictions_per_seq
        self._outputs = self._compiled(lambda ids, segments, positions: model([ids, segments, positions]))
        self._stats = self._compiled(lambda batch: pretraining_stats(
            model([batch[k] for k in MODEL_INPUTS]), batch, self.with_nsp))
        self._encode = self._compiled(lambda ids, segments: model.encode(ids, segments))

    @classmethod
    def build(cls, config: BertConfig | ModernBertConfig, max_seq_length: int, max_predictions_per_seq: int,
              with_nsp: bool, seed: int | None = None) -> JaxInference:
        if seed is not None:
            keras.utils.set_random_seed(seed)
        model = jax_family(config).build(config, max_seq_length, max_predictions_per_seq, with_nsp, dtype="float32")
        return cls(model, max_seq_length, max_predictions_per_seq)

    def _compiled(self, function):
        """``function`` compiled with the model's current weights as arguments (read again on every call)."""
        variables = self.model.variables

        def pure(values, *args):
            with keras.StatelessScope(state_mapping=list(zip(variables, values, strict=True))):
                return function(*args)

        compiled = jax.jit(pure)
        return lambda *args: compiled([v.value for v in variables], *args)

    # -- the contract ---------------------------------------------------------------------------------
    def load_stored_weights(self, weights: dict[str, np.ndarray], source: str) -> list[str]:
        return self.family.assign(self.family.variables(self.model), weights, source)[1]

    def stored_weights(self, skip=()) -> dict[str, np.ndarray]:
        return self.family.stored_weights(self.model, skip)

    def outputs(self, input_ids, segment_ids, positions) -> list[np.ndarray]:
        out = self._outputs(*(np.asarray(x, np.int32) for x in (input_ids, segment_ids, positions)))
        return [np.asarray(x) for x in out]

    def batch_stats(self, batch: dict) -> dict:
        wanted = (*MODEL_INPUTS, "masked_lm_ids", "masked_lm_weights", "next_sentence_labels")
        return jax.device_get(self._stats({k: batch[k] for k in wanted}))

    def hidden_states(self, input_ids, segment_ids) -> np.ndarray:
        out = []
        for start in range(0, len(input_ids), ENCODE_BATCH):
            ids, segments = (np.asarray(x[start:start + ENCODE_BATCH], np.int32) for x in (input_ids, segment_ids))
            rows = len(ids)
            pad = ((0, ENCODE_BATCH - rows), (0, 0))
            out.append(np.asarray(self._encode(np.pad(ids, pad), np.pad(segments, pad)))[:rows])
        return np.concatenate(out)

    def fresh_copy(self, seed: int) -> JaxInference:
        return JaxInference.build(self.config, self.max_seq_length, self.max_predictions_per_seq, self.with_nsp, seed)

    def finetune_accuracy(self, train, test, num_labels: int, epochs: int, learning_rate: float, seed: int,
                          batch_size: int) -> float:
        """Fine-tune the encoder (in place) with a linear head on its mean-pooled states; held-out accuracy."""
        keras.utils.set_random_seed(seed)
        classifier = MeanPooledClassifier(self.model, num_labels, seed)
        classifier.compile(optimizer=keras.optimizers.Adam(learning_rate),
                           loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        (train_ids, train_seg, train_y), (test_ids, test_seg, test_y) = train, test
        classifier.fit([train_ids, train_seg], train_y, batch_size=batch_size, epochs=epochs, verbose=0, shuffle=True)
        return float(classifier.evaluate([test_ids, test_seg], test_y, batch_size=64, verbose=0)[1])


class MeanPooledClassifier(keras.Model):
    """Logits of a linear head on the encoder's mean-pooled last hidden states (padding left out)."""

    def __init__(self, bert: PretrainingBert, num_labels: int, seed: int):
        super().__init__()
        self.bert = bert
        self.head = keras.layers.Dense(num_labels, kernel_initializer=keras.initializers.TruncatedNormal(
            stddev=0.02, seed=seed))

    def call(self, inputs, training=False):
        ids, segments = inputs
        hidden = self.bert.encode(ids, segments, training=training)
        mask = ops.cast(ids > 0, hidden.dtype)[..., None]
        return self.head(ops.sum(hidden * mask, axis=1) / ops.sum(mask, axis=1))
