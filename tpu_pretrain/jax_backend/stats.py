"""The MLM/NSP statistics of :mod:`..core.metrics` in ``jax.numpy``."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..core import metrics


class JaxOps:
    """:class:`..core.metrics.ArrayOps` in ``jax.numpy``."""

    float32 = staticmethod(lambda x: jnp.asarray(x, jnp.float32))
    log_softmax = staticmethod(jax.nn.log_softmax)
    sum = staticmethod(jnp.sum)

    @staticmethod
    def pick(values, labels):
        return jnp.take_along_axis(values, labels[..., None], axis=-1)[..., 0]

    @staticmethod
    def argmax(logits):
        return jnp.argmax(logits, -1)

    @staticmethod
    def rows(labels):
        return jnp.float32(labels.shape[0])


def pretraining_stats(outputs, batch: dict, with_nsp: bool) -> dict:
    """Summed statistics of a batch (:func:`..core.metrics.pretraining_stats`) as JAX arrays."""
    return metrics.pretraining_stats(outputs, batch, with_nsp, JaxOps)
