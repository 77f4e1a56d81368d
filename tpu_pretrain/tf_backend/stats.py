"""The MLM/NSP statistics of :mod:`..core.metrics` in TensorFlow operations."""

from __future__ import annotations

from ..core import metrics
from .framework import tf


class TensorFlowOps:
    """:class:`..core.metrics.ArrayOps` in TensorFlow."""

    float32 = staticmethod(lambda x: tf.cast(x, tf.float32))
    sum = staticmethod(tf.reduce_sum)

    @staticmethod
    def loss_and_prediction(logits, labels):
        loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.cast(labels, tf.int32), logits=logits)
        return loss, tf.argmax(logits, -1, output_type=tf.int32)

    @staticmethod
    def rows(labels):
        return tf.cast(tf.shape(labels)[0], tf.float32)


def pretraining_stats(outputs, batch: dict, with_nsp: bool) -> dict:
    """Summed statistics of a batch (:func:`..core.metrics.pretraining_stats`) as TensorFlow tensors."""
    return metrics.pretraining_stats(outputs, batch, with_nsp, TensorFlowOps)
