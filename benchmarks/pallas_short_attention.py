"""A candidate for the next GPU card: attention at BERT's length (128) as two Pallas (Triton) kernels whose programs
hold every key at once, so that the backward pass is one kernel with no helpers.

Why: on the H200's trace of BERT-base's step (benchmarks/GPU_NOTES.md, 2026-11-28) cuDNN's attention took 4.52 ms per
step, 0.377 ms per block, where its bytes (q, k, v, the output and their gradients, ~600 MB) move in ~0.15 ms at the
card's copy rate: the backward 2.39 ms, the forward 0.91, and 1.23 ms of helpers around them (a kernel for each query's
``sum(dO * O)`` and one converting dQ from the float32 it accumulates atomically). JAX's Pallas flash attention does as
well in the step (1.000x) and no better: a helper kernel for the same sums, and its backward computes the scores
twice (once for dK and dV, once for dQ). At 128 keys neither is needed: a program of the backward owns one
sequence's head, every key and value in registers, and walks its queries in blocks (:data:`TILES`): per block
the scores once, the sums of ``dO * O`` from the output it reads anyway, dQ written once in the input's dtype, dK and
dV accumulated across the blocks and written at the end. Five products per block where the flash backward does seven;
one kernel where cuDNN runs three. The query's and value's projection biases come in too, added in the kernels, and
the backward sums their gradients as it goes (XLA read dQ and dV again for them: 22 reductions, 0.38 ms of the
H200's step).

The forward: a program per block of queries of a sequence's head, against every key (the softmax whole, no running
maximum), writing the output and each query's log-sum-exp for the backward.

Masks as the package's attention takes them: ``attend`` (padding) and ``documents`` (each token's document: a query
sees the keys of its own), as ids compared in the kernel (a key not attended is never seen; a query that sees no key at
all, padding, gets zeros and no gradient, never NaN). Lengths up to :data:`LONGEST` (a power of two), no
dropout (the package takes its fused path only without attention dropout), one device.

Measured by ``bench_kernels_gpu.py`` (alone, against cuDNN's call as the package makes it) and ``bench_step_variants.py
--variants base short_attention`` (in the step): the package takes it only if the card says it pays.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from support import kernel_tiles

from tpu_pretrain.jax_backend.gpu_layer_norm import pl, plgpu
from tpu_pretrain.jax_backend.reductions import summed_together

# (queries per block: [64, 128] float32 scores, probabilities and their gradients in registers; the forward's warps;
# the backward's, which holds dK and dV, [128, 64] float32 each, besides); SHORT_ATTENTION_TILES overrides
TILES = kernel_tiles("SHORT_ATTENTION_TILES", (64, 4, 8))
LONGEST = 256  # every key in one program's registers: longer sequences are the flash kernels' work
MASKED = -1e30  # a score no key may be seen at; finite, so a row with nothing to see stays finite
LOG2_E = math.log2(math.e)


def applies(shape) -> bool:
    """Whether ``[batch, length, heads, head_size]`` is a shape these kernels take: a length and a head size that are
    powers of two (Triton's blocks), the length at most :data:`LONGEST`."""
    _, length, _, size = shape
    return all(n >= 16 and n & (n - 1) == 0 for n in (length, size)) and length <= LONGEST


def ids(attend, documents=None):
    """``(query ids, key ids)`` ``[batch, length]`` int32: a query sees the keys of equal id. Keys not attended get
    -1, which no query has (documents' ids are 0 or more)."""
    queries = jnp.zeros(attend.shape, jnp.int32) if documents is None else documents.astype(jnp.int32)
    return queries, jnp.where(attend, queries, -1)


def _scores(q, k, q_ids, k_ids, scale):
    """A block's scores against every key in log2 units, masked."""
    s = plgpu.dot(q, k, trans_b=True).astype(jnp.float32) * (scale * LOG2_E)
    return jnp.where(q_ids[:, None] == k_ids[None, :], s, MASKED)


def _biased(block, bias_ref):
    """A block of queries or values with their projection's bias added (in float32, rounded once more)."""
    return (block.astype(jnp.float32) + bias_ref[...].astype(jnp.float32)[None, :]).astype(block.dtype)


def _forward_kernel(q_ref, k_ref, v_ref, q_bias_ref, v_bias_ref, q_ids_ref, k_ids_ref, o_ref, lse_ref, *, scale):
    s = _scores(_biased(q_ref[...], q_bias_ref), k_ref[...], q_ids_ref[...], k_ids_ref[...], scale)
    top = jnp.max(s, axis=1)
    p = jnp.exp2(s - top[:, None])
    total = jnp.sum(p, axis=1)
    o = plgpu.dot(p.astype(v_ref.dtype), _biased(v_ref[...], v_bias_ref)).astype(jnp.float32) / total[:, None]
    # a query that sees no key (padding) gets zeros, and a log-sum-exp above every score: the backward's
    # probabilities, exp2(score - lse), are then 0 for it, where -1e30 + log2(total) would round back to -1e30
    sees = top > MASKED / 2
    o_ref[...] = jnp.where(sees[:, None], o, 0.0).astype(o_ref.dtype)
    lse_ref[...] = jnp.where(sees, top + jnp.log2(total), -MASKED)


def _backward_kernel(q_ref, k_ref, v_ref, q_bias_ref, v_bias_ref, q_ids_ref, k_ids_ref, o_ref, do_ref, lse_ref,
                     dq_ref, dk_ref, dv_ref, dq_bias_ref, dv_bias_ref, *, scale, block):
    k, v, k_ids = k_ref[...], _biased(v_ref[...], v_bias_ref), k_ids_ref[...]

    def queries(i, sums):
        dk, dv, dq_bias = sums
        rows = pl.ds(i * block, block)
        q, do = _biased(q_ref[rows, :], q_bias_ref), do_ref[rows, :]
        p = jnp.exp2(_scores(q, k, q_ids_ref[rows], k_ids, scale) - lse_ref[rows][:, None])
        # each query's sum of dO * O: the softmax's gradient's shift, here rather than a kernel of its own
        shift = jnp.sum(do.astype(jnp.float32) * o_ref[rows, :].astype(jnp.float32), axis=1)
        dv = dv + plgpu.dot(p.astype(do.dtype), do, trans_a=True).astype(jnp.float32)
        dp = plgpu.dot(do, v, trans_b=True).astype(jnp.float32)
        ds = (p * (dp - shift[:, None]) * scale).astype(q.dtype)
        dq = plgpu.dot(ds, k).astype(dq_ref.dtype)
        dq_ref[rows, :] = dq
        # the query bias's gradient: dQ summed over the rows as stored, here rather than a reduction reading it again
        dq_bias = dq_bias + jnp.sum(dq.astype(jnp.float32), axis=0)
        return dk + plgpu.dot(ds, q, trans_a=True).astype(jnp.float32), dv, dq_bias

    zeros = jnp.zeros(k.shape, jnp.float32)
    dk, dv, dq_bias = jax.lax.fori_loop(0, q_ref.shape[0] // block, queries,
                                        (zeros, zeros, jnp.zeros(k.shape[1:], jnp.float32)))
    dk_ref[...] = dk.astype(dk_ref.dtype)
    dv = dv.astype(dv_ref.dtype)
    dv_ref[...] = dv
    dq_bias_ref[...] = dq_bias
    dv_bias_ref[...] = jnp.sum(dv.astype(jnp.float32), axis=0)


def _specs(length, size, block=None):
    """BlockSpecs over ``[batch, length, heads, size]`` arrays and their ``[batch, length]`` ids: a block of queries
    (``block``; grid ``(batch, heads, blocks)``) or the whole sequence (grid ``(batch, heads)``)."""
    if block is None:
        return (pl.BlockSpec((None, length, None, size), lambda b, h: (b, 0, h, 0)),
                pl.BlockSpec((None, length), lambda b, h: (b, 0)),
                pl.BlockSpec((None, None, length), lambda b, h: (b, h, 0)))
    return (pl.BlockSpec((None, block, None, size), lambda b, h, i: (b, i, h, 0)),
            pl.BlockSpec((None, block), lambda b, h, i: (b, i)),
            pl.BlockSpec((None, None, block), lambda b, h, i: (b, h, i)))


def _forward(q, k, v, q_bias, v_bias, q_ids, k_ids, interpret, tiles):
    block, warps, _ = tiles or TILES
    batch, length, heads, size = q.shape
    block = min(block, length)
    rows, row_ids, row_lse = _specs(length, size, block)
    whole, whole_ids, _ = _specs(length, size)
    keys = pl.BlockSpec(whole.block_shape, lambda b, h, i: (b, 0, h, 0))
    key_ids = pl.BlockSpec(whole_ids.block_shape, lambda b, h, i: (b, 0))
    head_bias = pl.BlockSpec((None, size), lambda b, h, i: (h, 0))
    return pl.pallas_call(
        functools.partial(_forward_kernel, scale=1 / math.sqrt(size)), grid=(batch, heads, length // block),
        in_specs=[rows, keys, keys, head_bias, head_bias, row_ids, key_ids], out_specs=[rows, row_lse],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((batch, heads, length), jnp.float32)],
        interpret=interpret, name="short_attention_forward", compiler_params=plgpu.CompilerParams(num_warps=warps),
    )(q, k, v, q_bias, v_bias, q_ids, k_ids)


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8))
def attention(q, k, v, q_bias, v_bias, q_ids, k_ids, interpret=False, tiles=None):
    """Softmax attention of ``[batch, length, heads, head_size]`` arrays, ``q + q_bias`` and ``v + v_bias`` (``[heads,
    head_size]``: the projections' biases, whose gradients the backward kernel sums in its pass), query ``i`` seeing
    the keys ``j`` with ``k_ids[j] == q_ids[i]`` (:func:`ids`), in ``q``'s dtype. ``tiles``: ``(queries per block,
    the forward's warps, the backward's)``, :data:`TILES` if None."""
    return _forward(q, k, v, q_bias, v_bias, q_ids, k_ids, interpret, tiles)[0]


def _attention_forward(q, k, v, q_bias, v_bias, q_ids, k_ids, interpret, tiles):
    o, lse = _forward(q, k, v, q_bias, v_bias, q_ids, k_ids, interpret, tiles)
    return o, (q, k, v, q_bias, v_bias, q_ids, k_ids, o, lse)


def _attention_backward(interpret, tiles, saved, do):
    q, k, v, q_bias, v_bias, q_ids, k_ids, o, lse = saved
    block, _, warps = tiles or TILES
    batch, length, heads, size = q.shape
    whole, whole_ids, whole_lse = _specs(length, size)
    head_bias = pl.BlockSpec((None, size), lambda b, h: (h, 0))
    partial = pl.BlockSpec((None, None, size), lambda b, h: (b, h, 0))
    kernel = functools.partial(_backward_kernel, scale=1 / math.sqrt(size), block=min(block, length))
    dq, dk, dv, dq_bias, dv_bias = pl.pallas_call(
        kernel, grid=(batch, heads),
        in_specs=[whole, whole, whole, head_bias, head_bias, whole_ids, whole_ids, whole, whole, whole_lse],
        out_specs=[whole, whole, whole, partial, partial],
        out_shape=[*(jax.ShapeDtypeStruct(t.shape, t.dtype) for t in (q, k, v)),
                   *[jax.ShapeDtypeStruct((batch, heads, size), jnp.float32)] * 2],
        interpret=interpret, name="short_attention_backward", compiler_params=plgpu.CompilerParams(num_warps=warps),
    )(q, k, v, q_bias, v_bias, q_ids, k_ids, o, do.astype(q.dtype), lse)
    # the sequences' partial sums of both biases' gradients added up in one reduction
    dq_bias, dv_bias = summed_together([dq_bias, dv_bias], (0,))
    return dq, dk, dv, dq_bias.astype(q_bias.dtype), dv_bias.astype(v_bias.dtype), None, None


attention.defvjp(_attention_forward, _attention_backward)
