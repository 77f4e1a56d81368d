"""Table lookups whose gradients a GPU computes fast: :class:`TokenEmbedding` (gathered from the float32 table),
:class:`OneHotEmbedding` and :func:`one_hot_rows` (one-hot matmuls: no scatter-add in the gradient at all), and
:func:`tied_logits` (the MLM head's product with the token table, as wide as the GEMM computes it).

The same values as Keras's ``Embedding`` and ``take_along_axis``; what differs is the backward pass. Measured on an
H100 (benchmarks/GPU_NOTES.md): the bfloat16 scatter-adds of BERT-base's embeddings took 270 ms of a 333 ms step.
"""

from __future__ import annotations

import functools

from . import select_keras_backend

select_keras_backend()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import keras  # noqa: E402
from keras import ops  # noqa: E402

from .devices import compute_at_least, target_device  # noqa: E402
from .lean_layers import add_bias  # noqa: E402


class TokenEmbedding(keras.layers.Embedding):
    """The token table, its weights float32 (Keras's ``Embedding``'s): compiled for a GPU (``float32_gather``, the
    caller asks :func:`.devices.target_platform`), gathered from the float32 table and cast after; elsewhere cast to
    the compute dtype first, as Keras's layer does.

    The same rows either way; what changes is the gradient, a scatter-add into the table: in bfloat16 a GPU adds
    each update with a compare-and-swap loop, serialised on the rows real text repeats, which took 270 ms of a
    333 ms BERT-base step on an H100; in float32 it is the hardware's atomic add. A TPU adds bfloat16 rows without
    that serialisation, and its compiler, given the float32 gather in a step sharded over several chips, reports no
    temporaries at all (0 bytes on a v5e-8 where Keras's order gives 9.8 MB), so ``tpu-pretrain plan`` would
    undercount the step's memory. Off a GPU the gradient is summed in float32 all the same (:func:`gathered_rows`).
    """

    def build(self, input_shape=None):
        if not self.built:
            self._embeddings = self.add_weight(shape=(self.input_dim, self.output_dim), name="embeddings",
                                               initializer=self.embeddings_initializer, autocast=False)
            self.built = True

    def call(self, inputs, float32_gather: bool = False):
        if float32_gather:
            return super().call(inputs)  # the table is not autocast: gathered in float32, cast after
        return gathered_rows(ops.convert_to_tensor(self.embeddings), ops.cast(inputs, "int32"), self.compute_dtype)


def gathered_rows(table, ids, dtype):
    """``table`` cast to ``dtype``, then its rows at ``ids``; where ``dtype`` is narrower than the table, each row's
    gradient summed in the table's dtype (a scatter-add into a float32 table), not in ``dtype``.

    Why: autodiff's gradient is a scatter-add into a table of the cast's dtype, and a scatter into bfloat16 rounds each
    row to bfloat16 after every update: the rows of the tokens a batch repeats most, a sum of hundreds of updates,
    were 2-4% off (18% for the commonest where the updates share a direction; BERT's vocabulary, 16,384 Zipfian
    tokens, XLA's CPU compile; benchmarks/GPU_NOTES.md). The forward pass is the same (cast, then gather); the
    float32 gradient costs a TPU ~0.5% of BERT-base's step by its compiler's count (v5e-1, batch 128: 127.3 -> 128.0 M
    cycles), what the optimizer and the clipping norm read in float32."""
    dtype = jnp.dtype(dtype)
    if dtype == table.dtype:
        return jnp.take(table, ids, axis=0)
    return _gathered_rows(table, ids, dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _gathered_rows(table, ids, dtype):
    return jnp.take(table.astype(dtype), ids, axis=0)


def _gathered_rows_forward(table, ids, dtype):
    return _gathered_rows(table, ids, dtype), (table, ids)


def _gathered_rows_backward(dtype, residuals, grad):
    table, ids = residuals
    summed = jnp.zeros(table.shape, table.dtype).at[ids].add(grad.astype(table.dtype))
    return summed, None


_gathered_rows.defvjp(_gathered_rows_forward, _gathered_rows_backward)


class OneHotEmbedding(keras.layers.Embedding):
    """A small table (segments, positions) looked up as one-hot rows times the table: its gradient is a matmul
    instead of a scatter-add of every token into a few rows (what TPU BERT has always done for such tables)."""

    def call(self, inputs):
        return one_hot_rows(ops.cast(self.embeddings, self.compute_dtype), inputs)


def one_hot_rows(table, index):
    """``table[index]`` as ``one_hot(index) @ table``: exact (one product per output, accumulated in float32), and
    differentiated without a scatter. ``table`` ``[rows, width]`` or ``[batch, rows, width]`` (then ``index`` is
    ``[batch, n]``: each batch row's own table, the MLM head's gather of the masked positions)."""
    picks = jax.nn.one_hot(index, table.shape[-2], dtype=table.dtype)
    return jnp.matmul(picks, table, precision=jax.lax.Precision.HIGHEST)


LOGITS_COLUMNS = 64  # a GPU's training logits span the vocabulary padded to a multiple of this
PADDED_LOGITS_CAPABILITY = 8.0  # Ampere and newer (bfloat16): not the T4


def pads_logits(mesh=None) -> bool:
    """Whether a training step compiled for ``mesh``'s devices takes :func:`tied_logits` ``padded``: on a GPU of
    compute capability 8.0 or above. Not on a T4: BERT-base's float16 step compiled for one gained 23 copies of
    activations with them (XLA's schedule put a reader of the residual's gradient after the GEMM that accumulates
    onto it in place; 163.0 -> 164.9 ms estimated at batch 64); nor on a TPU (:func:`tied_logits`)."""
    return compute_at_least(target_device(mesh), PADDED_LOGITS_CAPABILITY)  # a GPU's capability, else False


def tied_logits(x, table, bias=None, padded: bool = False):
    """``x @ table.T (+ bias)`` in ``x``'s dtype: the MLM logits of a head tied to the token table. ``padded`` (a
    GPU's training step: :func:`pads_logits`): over the vocabulary padded to a multiple of :data:`LOGITS_COLUMNS`,
    each padded column at the dtype's lowest value, so a softmax gives it 0 (its gradient is 0) and an argmax never
    picks it.

    Why: cuBLAS wants the table's rows a multiple of 8, so XLA pads it (30,522 -> 30,528 for BERT's vocabulary) and
    slices the logits; the slice's gradient was then a pad, a copy of the whole ``[predictions, vocabulary]``
    gradient (0.16 ms of BERT-base's step at batch 256 compiled for an H200). Logits as wide as the product need none.
    Not on a TPU: its compiler counted more bytes and temporaries with them (v5e, L2-H768 at batch 64: 6.99 -> 7.03
    GB, 0.33 -> 0.43 GiB).
    """
    table = ops.cast(table, x.dtype)
    extra = -table.shape[0] % LOGITS_COLUMNS if padded else 0
    if extra:
        table = jnp.pad(table, ((0, extra), (0, 0)))
    logits = ops.matmul(x, ops.transpose(table))
    if bias is not None:
        bias = ops.cast(bias, x.dtype)
        bias = jnp.pad(bias, (0, extra), constant_values=jnp.finfo(x.dtype).min) if extra else bias
        logits = add_bias(logits, bias, for_gpu=padded)  # padded: a GPU's training step
    elif extra:
        logits = jnp.where(jnp.arange(logits.shape[-1]) < table.shape[0] - extra, logits, jnp.finfo(x.dtype).min)
    return logits
