"""LayerNorm as two Pallas (Triton) GPU kernels, a candidate for a GPU session to measure before it enters the package.

On the H100's trace the step's 25 LayerNorms took 7.4 ms (forward 2.8, backward 4.6; XLA's Triton fusions of the
backward ran at half the card's bandwidth) against ~2.5 ms at one pass over their tensors (benchmarks/GPU_NOTES.md).
Here a program normalises ``ROWS`` rows at once, its columns one power-of-two block masked to the row's width (the
Triton lowering wants power-of-two shapes; BERT's rows are 768 wide): the forward reads the input once and writes
the output and two float32 numbers per row; the backward reads the input, the output's gradient and those numbers
once, writes the input's gradient and, per program, partial sums of the scale's and offset's gradients, which XLA
then adds up (``[rows / ROWS, width]`` float32, a few MB). JAX's own Pallas layer norm
(``jax.experimental.pallas.ops.gpu.layer_norm``) keeps the statistics in the input's dtype and reduces the weights'
gradients over as many programs as there are column blocks, a few dozen for 768 columns.

``layer_norm(x, gamma, beta, eps, interpret=False)``: ``x`` ``[..., width]`` in any float dtype (the arithmetic in
float32, the result in ``x``'s dtype), ``gamma`` and ``beta`` ``[width]``. ``interpret=True`` runs the kernels in
JAX's Pallas interpreter, on any backend: how the tests check them on a CPU. ``bench_step_variants.py`` has it as
the ``pallas_layernorm`` variant (a GPU's only: Triton kernels).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

ROWS = 8  # rows per program: 8 x 1,024 float32 values in registers across 4 warps


def _block(width: int) -> int:
    return max(16, pl.next_power_of_2(width))


def _place(program, n_rows: int, width: int, block: int):
    """A program's rows and the block's columns, and which of them (and of the tile) hold data."""
    rows, cols = program * ROWS + jnp.arange(ROWS), jnp.arange(block)
    in_row, row_mask = cols < width, rows < n_rows
    return rows, cols, in_row, row_mask, row_mask[:, None] & in_row[None, :]


def _tile(ref, rows, cols, mask):
    return plgpu.load(ref.at[rows[:, None], cols[None, :]], mask=mask, other=0.0).astype(jnp.float32)


def _weights(ref, cols, in_row):
    return plgpu.load(ref.at[cols], mask=in_row, other=0.0).astype(jnp.float32)


def _forward_kernel(x_ref, gamma_ref, beta_ref, y_ref, mean_ref, rstd_ref, *, eps, width, block):
    rows, cols, in_row, row_mask, mask = _place(pl.program_id(0), x_ref.shape[0], width, block)
    x = _tile(x_ref, rows, cols, mask)
    mean = jnp.sum(x, axis=1) / width
    centred = jnp.where(mask, x - mean[:, None], 0.0)
    rstd = jax.lax.rsqrt(jnp.sum(centred * centred, axis=1) / width + eps)
    y = centred * rstd[:, None] * _weights(gamma_ref, cols, in_row)[None, :] + _weights(beta_ref, cols, in_row)[None, :]
    plgpu.store(y_ref.at[rows[:, None], cols[None, :]], y.astype(y_ref.dtype), mask=mask)
    plgpu.store(mean_ref.at[rows], mean, mask=row_mask)
    plgpu.store(rstd_ref.at[rows], rstd, mask=row_mask)


def _backward_kernel(x_ref, dy_ref, gamma_ref, mean_ref, rstd_ref, dx_ref, dgamma_ref, dbeta_ref, *, width, block):
    program = pl.program_id(0)
    rows, cols, in_row, row_mask, mask = _place(program, x_ref.shape[0], width, block)
    x, dy = _tile(x_ref, rows, cols, mask), _tile(dy_ref, rows, cols, mask)
    mean = plgpu.load(mean_ref.at[rows], mask=row_mask, other=0.0)
    rstd = plgpu.load(rstd_ref.at[rows], mask=row_mask, other=0.0)
    normed = jnp.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
    scaled = dy * _weights(gamma_ref, cols, in_row)[None, :]
    along_normed = jnp.sum(scaled * normed, axis=1) / width
    mean_scaled = jnp.sum(scaled, axis=1) / width
    dx = (scaled - mean_scaled[:, None] - normed * along_normed[:, None]) * rstd[:, None]
    plgpu.store(dx_ref.at[rows[:, None], cols[None, :]], dx.astype(dx_ref.dtype), mask=mask)
    plgpu.store(dgamma_ref.at[program, cols], jnp.sum(dy * normed, axis=0), mask=in_row)
    plgpu.store(dbeta_ref.at[program, cols], jnp.sum(dy, axis=0), mask=in_row)


def _forward(x2, gamma, beta, eps, interpret):
    rows, width = x2.shape
    kernel = functools.partial(_forward_kernel, eps=eps, width=width, block=_block(width))
    return pl.pallas_call(
        kernel, grid=(pl.cdiv(rows, ROWS),), interpret=interpret, name="layer_norm_forward",
        compiler_params=plgpu.CompilerParams(num_warps=4),
        out_shape=[jax.ShapeDtypeStruct(x2.shape, x2.dtype), jax.ShapeDtypeStruct((rows,), jnp.float32),
                   jax.ShapeDtypeStruct((rows,), jnp.float32)])(x2, gamma, beta)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _layer_norm_2d(x2, gamma, beta, eps, interpret):
    return _forward(x2, gamma, beta, eps, interpret)[0]


def _layer_norm_2d_forward(x2, gamma, beta, eps, interpret):
    y, mean, rstd = _forward(x2, gamma, beta, eps, interpret)
    return y, (x2, gamma, beta, mean, rstd)


def _layer_norm_2d_backward(eps, interpret, saved, dy):
    x2, gamma, beta, mean, rstd = saved
    rows, width = x2.shape
    programs = pl.cdiv(rows, ROWS)
    kernel = functools.partial(_backward_kernel, width=width, block=_block(width))
    dx, dgamma, dbeta = pl.pallas_call(
        kernel, grid=(programs,), interpret=interpret, name="layer_norm_backward",
        compiler_params=plgpu.CompilerParams(num_warps=4),
        out_shape=[jax.ShapeDtypeStruct(x2.shape, x2.dtype),
                   jax.ShapeDtypeStruct((programs, width), jnp.float32),
                   jax.ShapeDtypeStruct((programs, width), jnp.float32)])(x2, dy, gamma, mean, rstd)
    return dx, jnp.sum(dgamma, axis=0).astype(gamma.dtype), jnp.sum(dbeta, axis=0).astype(beta.dtype)


_layer_norm_2d.defvjp(_layer_norm_2d_forward, _layer_norm_2d_backward)


def layer_norm(x, gamma, beta, eps: float, interpret: bool = False):
    """``(x - mean) / sqrt(var + eps) * gamma + beta`` over ``x``'s last axis by the two kernels (see the module)."""
    width = x.shape[-1]
    return _layer_norm_2d(x.reshape(-1, width), gamma, beta, eps, interpret).reshape(x.shape)
