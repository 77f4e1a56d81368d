"""LayerNorm as two Pallas (Triton) kernels on a GPU: one pass over the rows forward, one backward.

Compiled by XLA, each norm of a BERT step is two kernels forward (the row statistics, then the normalised rows: the
input read twice) and two backward, and the residual that cuBLAS adds into the GEMM before the norm costs a copy of
it first (the H100's trace of 2026-11-27 measured the 25 norms at 7.4 ms of a 53 ms step, the copies at 0.8 ms).
Here a program normalises :data:`ROWS` rows, its columns one power-of-two block masked to the row's width (the
Triton lowering wants power-of-two shapes; BERT's rows are 768 wide): the forward reads the input once and writes the
output and two float32 numbers per row; the backward reads the input, the output's gradient and those numbers once,
writes the input's gradient and, per program of :data:`BACKWARD_TILES` tiles, partial sums of the scale's and
offset's gradients, which XLA then adds up (``[rows / (ROWS x BACKWARD_TILES), width]`` float32, a few MB). A
dense layer's bias may come in too, added to the input by the forward kernel, its gradient summed the same way (BERT's
blocks hand theirs over: :meth:`.model.TransformerBlock.residual_norm`). JAX's
own Pallas layer norm keeps the statistics in the input's dtype and reduces the weights' gradients over as many
programs as there are column blocks (a few dozen for 768).

Measured on an H200 (2026-11-28, ``benchmarks/bench_step_variants.py``, ``xla_layernorm`` the step without them):
1.022x the BERT-base step (estimated 1.044x); on its trace the 49 norms' kernels take 2.5 ms of 43.

Where: ``TPU_PRETRAIN_LAYERNORM`` (:func:`layer_norm_path`). ``auto`` takes the kernels on a GPU of compute capability
8.0+ (XLA's Triton floor: not the free T4) when this JAX has Pallas's Triton backend (deprecated in jax 0.11 for
Mosaic GPU: where it is gone, XLA's norm); ``xla`` never; ``pallas`` always, in Pallas's interpreter off a GPU (the
tests). On several devices the kernels run per device on its own rows (``shard_map``), and XLA sums the weights'
partial gradients across them.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from ..environment import override_choice
from ..errors import UserInputError
from .devices import compute_at_least, per_device, target_device, target_platform
from .reductions import summed_together

try:
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    _KERNELS_AVAILABLE = all(hasattr(plgpu, name) for name in ("load", "store", "CompilerParams"))
except Exception:  # noqa: BLE001 - a JAX without a working Pallas Triton backend: XLA's norm, never a failed import
    pl = plgpu = None
    _KERNELS_AVAILABLE = False

# jax 0.11 says so at every lowering of a kernel (25 per BERT step); the fallback where it is gone is XLA's norm
warnings.filterwarnings("ignore", message="The Pallas Triton backend is deprecated")

LAYER_NORM_PATHS = ("auto", "xla", "pallas")
TRITON_CAPABILITY = 8.0  # XLA refuses Triton below it ("Triton support is only enabled for Ampere GPUs and up")
ROWS = 8  # rows per tile: 8 x 1,024 float32 values in registers across 4 warps
# tiles a backward program loops over, summing the weights' gradients as it goes: its partial sums are a row per 32
# rows, not per 8 (an H200's trace of 2026-11-28: summing 8-row partials cost 0.59 ms of a 43 ms BERT-base step)
BACKWARD_TILES = 4
WARPS = 4  # per program, each way


def layer_norm_path(setting: str | None = None) -> str:
    """The LayerNorm path asked for: ``setting``, else ``TPU_PRETRAIN_LAYERNORM``, else ``auto``."""
    return override_choice("TPU_PRETRAIN_LAYERNORM", LAYER_NORM_PATHS, "LayerNorm path", setting)


def applies(mesh=None, path: str | None = None) -> bool:
    """Whether a norm compiled for ``mesh``'s devices (None: this process's) takes the kernels under ``path``."""
    path = layer_norm_path(path)
    if path == "pallas" and not _KERNELS_AVAILABLE:
        raise UserInputError(f"TPU_PRETRAIN_LAYERNORM=pallas: this JAX ({jax.__version__}) has no Pallas Triton "
                             "backend; use auto or xla.")
    return path == "pallas" or (path == "auto" and _KERNELS_AVAILABLE  # a GPU's capability, else False:
                                and compute_at_least(target_device(mesh), TRITON_CAPABILITY))


def layer_norm(x, gamma, beta, eps: float, mesh=None, bias=None):
    """``(x - mean) / sqrt(var + eps) * gamma + beta`` over ``x``'s last axis (``beta`` None: no offset) of ``x +
    bias`` (``bias`` None: ``x``), the arithmetic in float32 and the result in ``x``'s dtype; ``x``'s rows split over
    ``mesh``'s devices along its first axis where they divide evenly (else XLA gathers them: an eval batch the devices
    do not divide). Pallas's interpreter runs the kernels where ``mesh`` is not a GPU's.

    ``bias``: a dense layer's bias, added here rather than by its GEMM, so that its gradient (the sum over the rows of
    the input's gradient) is summed by the backward kernel in its pass, as the scale's and offset's are, where XLA
    would read the whole gradient again in a reduction of its own (24 per BERT-base step, 0.41 ms of an H200's 43)."""
    width = x.shape[-1]
    beta = jnp.zeros_like(gamma) if beta is None else beta
    several = mesh is not None and mesh.devices.size > 1 and (x.size // width) % mesh.devices.size == 0
    run = _Run(eps, target_platform(mesh) != "gpu", mesh if several else None, bias is not None)
    bias = jnp.zeros_like(gamma) if bias is None else bias
    return _layer_norm_2d(x.reshape(-1, width), gamma, beta, bias, run).reshape(x.shape)


@dataclass(frozen=True)
class _Run:
    """How the kernels run (static under ``jax.jit``): epsilon, interpreted or not, per device of ``mesh`` or not."""

    eps: float
    interpret: bool
    mesh: object = None
    with_bias: bool = False  # a bias added to the input, its gradient summed by the backward kernel

    def on_rows(self, kernel, rows_in: int, rows_out: int):
        """``kernel`` over each device's rows: its first ``rows_in`` operands and ``rows_out`` results split along
        their first axis, the rest replicated."""
        if self.mesh is None:
            return kernel
        split, whole = PartitionSpec(self.mesh.axis_names[0]), PartitionSpec()

        def call(*operands):
            ins = tuple(split if i < rows_in else whole for i in range(len(operands)))
            return per_device(kernel, self.mesh, ins, (split,) * rows_out)(*operands)

        return call


def _block(width: int) -> int:
    return max(16, pl.next_power_of_2(width))


def _place(tile, n_rows: int, width: int, block: int):
    """A tile's rows and the block's columns, and which of them (and of the tile) hold data."""
    rows, cols = tile * ROWS + jnp.arange(ROWS), jnp.arange(block)
    in_row, row_mask = cols < width, rows < n_rows
    return rows, cols, in_row, row_mask, row_mask[:, None] & in_row[None, :]


def _tile(ref, rows, cols, mask):
    return plgpu.load(ref.at[rows[:, None], cols[None, :]], mask=mask, other=0.0).astype(jnp.float32)


def _weights(ref, cols, in_row):
    return plgpu.load(ref.at[cols], mask=in_row, other=0.0).astype(jnp.float32)


def _forward_kernel(x_ref, gamma_ref, beta_ref, bias_ref, y_ref, mean_ref, rstd_ref, *, eps, width, block):
    rows, cols, in_row, row_mask, mask = _place(pl.program_id(0), x_ref.shape[0], width, block)
    x = _tile(x_ref, rows, cols, mask) + _weights(bias_ref, cols, in_row)[None, :]
    mean = jnp.sum(x, axis=1) / width
    centred = jnp.where(mask, x - mean[:, None], 0.0)
    rstd = jax.lax.rsqrt(jnp.sum(centred * centred, axis=1) / width + eps)
    y = centred * rstd[:, None] * _weights(gamma_ref, cols, in_row)[None, :] + _weights(beta_ref, cols, in_row)[None, :]
    plgpu.store(y_ref.at[rows[:, None], cols[None, :]], y.astype(y_ref.dtype), mask=mask)
    plgpu.store(mean_ref.at[rows], mean, mask=row_mask)
    plgpu.store(rstd_ref.at[rows], rstd, mask=row_mask)


def _backward_kernel(x_ref, dy_ref, gamma_ref, bias_ref, mean_ref, rstd_ref, dx_ref, dgamma_ref, dbeta_ref,
                     *dbias_ref, width, block):
    program = pl.program_id(0)
    cols = jnp.arange(block)
    gamma = _weights(gamma_ref, cols, cols < width)[None, :]
    bias = _weights(bias_ref, cols, cols < width)[None, :]

    def tile(t, sums):
        rows, cols, in_row, row_mask, mask = _place(program * BACKWARD_TILES + t, x_ref.shape[0], width, block)
        x, dy = _tile(x_ref, rows, cols, mask) + bias, _tile(dy_ref, rows, cols, mask)
        mean = plgpu.load(mean_ref.at[rows], mask=row_mask, other=0.0)
        rstd = plgpu.load(rstd_ref.at[rows], mask=row_mask, other=0.0)
        normed = jnp.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
        scaled = dy * gamma
        along_normed = jnp.sum(scaled * normed, axis=1) / width
        mean_scaled = jnp.sum(scaled, axis=1) / width
        dx = (scaled - mean_scaled[:, None] - normed * along_normed[:, None]) * rstd[:, None]
        plgpu.store(dx_ref.at[rows[:, None], cols[None, :]], dx.astype(dx_ref.dtype), mask=mask)
        # the bias's gradient is the input's, summed over the rows as stored (rounded to its dtype, as XLA's sum of
        # the stored gradient would read it); masked rows and columns are zero
        dbias = jnp.sum(dx.astype(dx_ref.dtype).astype(jnp.float32), axis=0) if dbias_ref else 0.0
        return sums[0] + jnp.sum(dy * normed, axis=0), sums[1] + jnp.sum(dy, axis=0), sums[2] + dbias

    zeros = jnp.zeros((block,), jnp.float32)
    dgamma, dbeta, dbias = jax.lax.fori_loop(0, BACKWARD_TILES, tile, (zeros, zeros, zeros))
    plgpu.store(dgamma_ref.at[program, cols], dgamma, mask=cols < width)
    plgpu.store(dbeta_ref.at[program, cols], dbeta, mask=cols < width)
    for ref in dbias_ref:
        plgpu.store(ref.at[program, cols], dbias, mask=cols < width)


def _forward(x2, gamma, beta, bias, run: _Run):
    def kernels(x2, gamma, beta, bias):
        rows, width = x2.shape
        kernel = functools.partial(_forward_kernel, eps=run.eps, width=width, block=_block(width))
        return pl.pallas_call(
            kernel, grid=(pl.cdiv(rows, ROWS),), interpret=run.interpret, name="layer_norm_forward",
            compiler_params=plgpu.CompilerParams(num_warps=WARPS),
            out_shape=[jax.ShapeDtypeStruct(x2.shape, x2.dtype), jax.ShapeDtypeStruct((rows,), jnp.float32),
                       jax.ShapeDtypeStruct((rows,), jnp.float32)])(x2, gamma, beta, bias)

    return run.on_rows(kernels, 1, 3)(x2, gamma, beta, bias)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _layer_norm_2d(x2, gamma, beta, bias, run: _Run):
    return _forward(x2, gamma, beta, bias, run)[0]


def _layer_norm_2d_forward(x2, gamma, beta, bias, run):
    y, mean, rstd = _forward(x2, gamma, beta, bias, run)
    return y, (x2, gamma, beta, bias, mean, rstd)


def _layer_norm_2d_backward(run, saved, dy):
    x2, gamma, beta, bias, mean, rstd = saved
    sums = 3 if run.with_bias else 2  # the weights' partial gradients the kernel writes: the bias's too where given

    def kernels(x2, dy, mean, rstd, gamma, bias):
        rows, width = x2.shape
        programs = pl.cdiv(rows, ROWS * BACKWARD_TILES)
        kernel = functools.partial(_backward_kernel, width=width, block=_block(width))

        def ordered(x_ref, dy_ref, mean_ref, rstd_ref, gamma_ref, bias_ref, *outs):
            kernel(x_ref, dy_ref, gamma_ref, bias_ref, mean_ref, rstd_ref, *outs)

        return pl.pallas_call(
            ordered, grid=(programs,), interpret=run.interpret, name="layer_norm_backward",
            compiler_params=plgpu.CompilerParams(num_warps=WARPS),
            out_shape=[jax.ShapeDtypeStruct(x2.shape, x2.dtype),
                       *[jax.ShapeDtypeStruct((programs, width), jnp.float32)] * sums])(x2, dy, mean, rstd, gamma,
                                                                                          bias)

    # per device: each one's programs' partial sums, joined along the programs; their sum is the weights' gradient
    dx, *partials = run.on_rows(kernels, 4, 1 + sums)(x2, dy, mean, rstd, gamma, bias)
    # added up together: one kernel, where a sum each was three per norm (72 per BERT-base step)
    dgamma, dbeta, *dbias = summed_together(partials, (0,))
    return (dx, dgamma.astype(gamma.dtype), dbeta.astype(beta.dtype),
            dbias[0].astype(bias.dtype) if dbias else jnp.zeros_like(bias))


_layer_norm_2d.defvjp(_layer_norm_2d_forward, _layer_norm_2d_backward)
