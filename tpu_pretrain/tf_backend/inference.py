"""The TensorFlow backend's half of :class:`..models.inference.InferenceModel`, and its own training checkpoints.

The bert4keras model of :mod:`.model`, built in float32 whatever mixed-precision policy training left
behind, filled with weights by Google name (:mod:`.weights`) or restored from one of this backend's
``tf.train.Checkpoint`` object graphs: those name their variables by the model's object paths, so this
module is the one way to read them (:func:`object_checkpoint_weights` for an export).
"""

from __future__ import annotations

import logging

import numpy as np

from ..models.bert_config import BertConfig
from ..models.run_weights import TENSORFLOW
from .framework import tf
from .model import PretrainingModel, build_pretraining_model
from .stats import pretraining_stats
from .weights import google_weights, load_google_weights

log = logging.getLogger(__name__)
MODEL_INPUTS = ("input_ids", "segment_ids", "masked_lm_positions")
STAT_INPUTS = (*MODEL_INPUTS, "masked_lm_ids", "masked_lm_weights", "next_sentence_labels")


def build_float32(config: BertConfig, max_seq_length: int, max_predictions: int, with_nsp: bool) -> PretrainingModel:
    """Build in float32 whatever global mixed-precision policy training left behind."""
    policy = tf.keras.mixed_precision.global_policy()
    tf.keras.mixed_precision.set_global_policy("float32")
    try:
        return build_pretraining_model(config, max_seq_length, max_predictions, with_nsp)
    finally:
        tf.keras.mixed_precision.set_global_policy(policy)


class TfInference:
    """A float32 :class:`.model.PretrainingModel` as evaluation, fill-mask, the probe and export use it."""

    backend = TENSORFLOW

    def __init__(self, pretraining: PretrainingModel):
        self.pretraining, self.config, self.with_nsp = pretraining, pretraining.config, pretraining.with_nsp
        self.max_seq_length = int(pretraining.model.inputs[0].shape[1])
        self.max_predictions_per_seq = int(pretraining.model.inputs[2].shape[1])
        self._stats = tf.function(self._batch_stats, reduce_retracing=True)

    @classmethod
    def build(cls, config: BertConfig, max_seq_length: int, max_predictions_per_seq: int, with_nsp: bool,
              seed: int = 0) -> TfInference:
        """Seeded: the initial values (replaced by the weights read next, kept where a checkpoint lacks some) are the
        same at every build, and TensorFlow's op determinism (TF_DETERMINISTIC_OPS=1) refuses an unseeded draw."""
        tf.keras.utils.set_random_seed(seed)
        return cls(build_float32(config, max_seq_length, max_predictions_per_seq, with_nsp))

    def restore_object_checkpoint(self, prefix: str) -> None:
        """Restore the model from a training checkpoint of this backend (its optimizer and data position ignored)."""
        status = tf.train.Checkpoint(model=self.pretraining.model).read(prefix)
        status.assert_existing_objects_matched()
        status.expect_partial()

    # -- the contract ---------------------------------------------------------------------------------
    def load_stored_weights(self, weights: dict[str, np.ndarray], source: str) -> list[str]:
        return load_google_weights(self.pretraining, weights, source).missing

    def stored_weights(self, skip=()) -> dict[str, np.ndarray]:
        return google_weights(self.pretraining, skip)

    def outputs(self, input_ids, segment_ids, positions) -> list[np.ndarray]:
        out = self.pretraining.model([np.asarray(x, np.int32) for x in (input_ids, segment_ids, positions)])
        return [np.asarray(x) for x in (out if isinstance(out, list | tuple) else [out])]

    def _batch_stats(self, batch: dict) -> dict:
        outputs = self.pretraining.model([batch[k] for k in MODEL_INPUTS], training=False)
        return pretraining_stats(outputs, batch, self.with_nsp)

    def batch_stats(self, batch: dict) -> dict:
        return {k: v.numpy() for k, v in self._stats({k: tf.constant(batch[k]) for k in STAT_INPUTS}).items()}

    def hidden_states(self, input_ids, segment_ids, batch_size: int = 64) -> np.ndarray:
        encoder = self.pretraining.encoder
        return np.concatenate([np.asarray(encoder.predict_on_batch([input_ids[s:s + batch_size],
                                                                    segment_ids[s:s + batch_size]]))
                               for s in range(0, len(input_ids), batch_size)])

    def fresh_copy(self, seed: int) -> TfInference:
        return TfInference.build(self.config, self.max_seq_length, self.max_predictions_per_seq, self.with_nsp, seed)

    def finetune_accuracy(self, train, test, num_labels: int, epochs: int, learning_rate: float, seed: int,
                          batch_size: int) -> float:
        """Fine-tune the encoder (in place) with a linear head on its mean-pooled states; held-out accuracy."""
        tf.keras.utils.set_random_seed(seed)
        encoder = self.pretraining.encoder
        ids_in = tf.keras.Input((self.max_seq_length,), dtype="int32")
        seg_in = tf.keras.Input((self.max_seq_length,), dtype="int32")

        def mean_pool(inputs):
            hidden, ids = inputs
            mask = tf.cast(ids > 0, hidden.dtype)[..., None]
            return tf.reduce_sum(hidden * mask, axis=1) / tf.reduce_sum(mask, axis=1)

        pooled = tf.keras.layers.Lambda(mean_pool)([encoder([ids_in, seg_in]), ids_in])
        logits = tf.keras.layers.Dense(num_labels, kernel_initializer=tf.keras.initializers.TruncatedNormal(
            stddev=0.02, seed=seed))(pooled)
        model = tf.keras.Model([ids_in, seg_in], logits)
        model.compile(optimizer=tf.keras.optimizers.Adam(learning_rate),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        (train_ids, train_seg, train_y), (test_ids, test_seg, test_y) = train, test
        model.fit([train_ids, train_seg], train_y, batch_size=batch_size, epochs=epochs, verbose=0, shuffle=True)
        return float(model.evaluate([test_ids, test_seg], test_y, batch_size=64, verbose=0)[1])


def object_checkpoint_weights(prefix: str, config: BertConfig, with_nsp: bool) -> dict[str, np.ndarray]:
    """The weights of one of this backend's training checkpoints, by Google name (the model maps the names)."""
    model = TfInference.build(config, min(128, config.max_position_embeddings), 1, with_nsp)
    model.restore_object_checkpoint(prefix)
    return model.stored_weights()
