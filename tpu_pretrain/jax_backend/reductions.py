"""Sums the GPU compiler makes fewer kernels of: the Pallas norms' partial gradients, the clipping norm's sums of
squares and the short-attention candidate's bias gradients all sum several arrays of one shape at once."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def summed_together(arrays, axes) -> list:
    """Each of ``arrays`` (of one shape) summed over ``axes`` in float32, all in one variadic reduction: on a GPU one
    kernel (or XLA's two stages) with an output per array, where a sum each was a kernel or two. A GPU's only: XLA's
    CPU adds a variadic reduction's elements in order, and the TPU compiler counted more bytes for it."""
    arrays = [a.astype(jnp.float32) for a in arrays]
    return jax.lax.reduce(arrays, [jnp.float32(0.0)] * len(arrays),
                          lambda xs, ys: [x + y for x, y in zip(xs, ys, strict=True)], tuple(axes))
