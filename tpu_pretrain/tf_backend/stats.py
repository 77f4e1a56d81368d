"""The MLM/NSP statistics of :mod:`..core.metrics` in TensorFlow operations."""

from __future__ import annotations

from ..core import metrics
from .framework import tf


class TensorFlowOps:
    """:class:`..core.metrics.ArrayOps` in TensorFlow."""

    float32 = staticmethod(lambda x: tf.cast(x, tf.float32))
    log_softmax = staticmethod(tf.nn.log_softmax)
    sum = staticmethod(tf.reduce_sum)

    @staticmethod
    def pick(values, labels):
        return tf.gather(values, tf.cast(labels, tf.int32), batch_dims=len(labels.shape))

    @staticmethod
    def argmax(logits):
        return tf.argmax(logits, -1, output_type=tf.int32)

    @staticmethod
    def rows(labels):
        return tf.cast(tf.shape(labels)[0], tf.float32)


def pretraining_stats(outputs, batch: dict, with_nsp: bool) -> dict:
    """Summed statistics of a batch (:func:`..core.metrics.pretraining_stats`) as TensorFlow tensors."""
    return metrics.pretraining_stats(outputs, batch, with_nsp, TensorFlowOps)
