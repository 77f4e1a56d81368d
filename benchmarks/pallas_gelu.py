"""A candidate for the next GPU card: the tanh GELU's gradient and its dense layer's bias gradient as one Pallas
(Triton) kernel, in place of XLA's fusion of the two.

Why: on an H200's trace of BERT-base's step (benchmarks/GPU_NOTES.md, 2026-11-28) XLA's fusion of the GELU's
gradient with the feed-forward bias's (`input_convert_reduce_fusion`, one per block) was the largest kernel that is
not a matrix product: 0.274 ms per block, 3.3 ms of a 43 ms step, moving its 604 MB at 2.2 TB/s where the card
copies at ~4.3 and the package's Pallas norms move theirs at ~2.8. Two suspects, neither visible in a compile here:
its arithmetic (XLA's exponential and IEEE division per element; the package's gradient since has one of each, not
two) and XLA's column reduction (the bias's gradient summed over 32,768 rows through shared memory in the same
kernel). This kernel answers both: Triton's exponential and division are the fast hardware forms, and each program
sums its columns in registers over the rows it owns, writing a row of partial sums per program (:data:`TILES`),
which one small reduction adds up (as the package's norms do).

Measured by ``bench_kernels_gpu.py`` (alone, on the step's shapes, against XLA's fusion in the package's form) and
``bench_step_variants.py --variants base pallas_gelu`` (in the step): the package takes it only if the card says it
pays. One device (the probe's card); the package's norms show how a kernel runs per device on several.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from support import kernel_tiles

from tpu_pretrain.jax_backend.gpu_layer_norm import pl, plgpu
from tpu_pretrain.jax_backend.lean_layers import _TANH_CUBIC, _TANH_SCALE

# (rows per tile, columns per program (3,072 = 12 blocks of 256), tiles a program loops over summing the bias's
# gradient as it goes (a partial row per 128 rows), warps); PALLAS_GELU_TILES overrides (support.kernel_tiles)
TILES = kernel_tiles("PALLAS_GELU_TILES", (16, 256, 8, 4))


def _slope(x):
    """The tanh GELU's derivative in float32, as :func:`tpu_pretrain.jax_backend.lean_layers.tanh_gelu`'s gradient
    writes it (one exponential and one division)."""
    twice = 2 * _TANH_SCALE * (x + _TANH_CUBIC * x * x * x)
    a = jnp.exp(-jnp.abs(twice))
    r = 1.0 / (1.0 + a)
    cdf = jnp.where(twice >= 0, r, a * r)
    return cdf + 2 * x * (a * r * r) * _TANH_SCALE * (1.0 + 3 * _TANH_CUBIC * x * x)


def _kernel(pre_ref, dy_ref, dpre_ref, partial_ref, *, tiles, rows, columns):
    program, block = pl.program_id(0), pl.program_id(1)
    cols = block * columns + jnp.arange(columns)
    in_width = cols < pre_ref.shape[1]

    def tile(t, total):
        at = (program * tiles + t) * rows + jnp.arange(rows)
        mask = (at < pre_ref.shape[0])[:, None] & in_width[None, :]
        where = (at[:, None], cols[None, :])
        pre = plgpu.load(pre_ref.at[where], mask=mask, other=0.0).astype(jnp.float32)
        dy = plgpu.load(dy_ref.at[where], mask=mask, other=0.0).astype(jnp.float32)
        dpre = (dy * _slope(pre)).astype(dpre_ref.dtype)
        plgpu.store(dpre_ref.at[where], dpre, mask=mask)
        # the bias's gradient from the stored (rounded) gradient, as XLA's sum of it would read it; masked: zeros
        return total + jnp.sum(dpre.astype(jnp.float32), axis=0)

    total = jax.lax.fori_loop(0, tiles, tile, jnp.zeros((columns,), jnp.float32))
    plgpu.store(partial_ref.at[program, cols], total, mask=in_width)


def gradient(pre, dy, interpret: bool = False, tiles=None):
    """``(dy * gelu'(pre), the sum of that over the rows in float32)`` for 2-D ``pre`` and ``dy``: the GELU's input's
    gradient (``pre``'s dtype) and the bias's. ``tiles``: as :data:`TILES` (which None takes)."""
    rows, columns, per_program, warps = tiles or TILES
    height, width = pre.shape
    programs = pl.cdiv(height, rows * per_program)
    kernel = functools.partial(_kernel, tiles=per_program, rows=rows, columns=columns)
    dpre, partial = pl.pallas_call(
        kernel, grid=(programs, pl.cdiv(width, columns)), interpret=interpret, name="gelu_backward",
        compiler_params=plgpu.CompilerParams(num_warps=warps),
        out_shape=[jax.ShapeDtypeStruct(pre.shape, pre.dtype),
                   jax.ShapeDtypeStruct((programs, width), jnp.float32)])(pre, dy)
    return dpre, jnp.sum(partial, axis=0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def bias_gelu(h, bias, interpret: bool = False):
    """``gelu(h + bias)`` (tanh, in ``h``'s dtype: the form cuBLASLt computes in the GEMM's epilogue, keeping ``h +
    bias`` for the backward), whose gradient is :func:`gradient`'s kernel. ``interpret``: Pallas's interpreter (off
    a GPU: the tests and smoke runs)."""
    return jax.nn.gelu(h + bias, approximate=True)


def _bias_gelu_forward(h, bias, interpret):
    pre = h + bias
    return jax.nn.gelu(pre, approximate=True), pre


def _bias_gelu_backward(interpret, pre, dy):
    dpre, dbias = gradient(pre.reshape(-1, pre.shape[-1]), dy.reshape(-1, pre.shape[-1]), interpret)
    return dpre.reshape(pre.shape), dbias.astype(pre.dtype)


bias_gelu.defvjp(_bias_gelu_forward, _bias_gelu_backward)
