"""The feed-forward activations, LayerNorm and the query/key/value projections in forms whose compiled training step
moves fewer bytes than Keras's.

The same values as Keras's GELUs and ``LayerNormalization`` (to float32's rounding); what differs is what the
forward pass writes for the backward and how many passes it makes over its input (for the projections, the order
in which the backward adds the input's gradients). Found by compiling BERT-base's
step for an H100 on a CPU and reading the GPU compiler's kernels (``benchmarks/bench_step_variants.py --compile_for
h100``; benchmarks/GPU_NOTES.md): estimated 48.1 -> 45.3 ms per step for the GELU's gradient, -0.9 ms more for the
norms' one-pass statistics, -0.6 ms for the projections' gradient; the tanh GELU in the GEMM's epilogue 42.2 -> 40.4.
"""

from __future__ import annotations

import functools
import math

from . import select_keras_backend

select_keras_backend()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import keras  # noqa: E402

from . import gpu_layer_norm  # noqa: E402
from .devices import target_platform  # noqa: E402


def _gelu32(x):
    return 0.5 * x * (1.0 + jax.lax.erf(x * math.sqrt(0.5)))


@jax.custom_vjp
def exact_gelu(x):
    """The exact (erf) GELU in float32, returned in ``x``'s dtype; its gradient keeps only ``x``.

    What JAX's autodiff of ``jax.nn.gelu`` keeps for the backward pass is three tensors the size of the
    feed-forward activation (its ``erfc`` form, written out by the forward kernel and read back), where the
    gradient needs only the input: compiled for an H100, the step moves 8% fewer bytes and is estimated 1.06x
    faster (``benchmarks/bench_step_variants.py --compile_for h100``); on a TPU v5e the compiler counts 5% fewer
    bytes. The ``erf`` form (PyTorch's) reads its input once, so the GPU compiler makes one kernel of it."""
    return _gelu32(x.astype(jnp.float32)).astype(x.dtype)


def _exact_gelu_forward(x):
    return exact_gelu(x), x


def _exact_gelu_backward(x, grad):
    x32 = x.astype(jnp.float32)
    slope = 0.5 * (1.0 + jax.lax.erf(x32 * math.sqrt(0.5))) + x32 * jnp.exp(-0.5 * x32 * x32) / math.sqrt(2 * math.pi)
    return ((grad.astype(jnp.float32) * slope).astype(x.dtype),)


exact_gelu.defvjp(_exact_gelu_forward, _exact_gelu_backward)


_TANH_SCALE, _TANH_CUBIC = math.sqrt(2 / math.pi), 0.044715


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def tanh_gelu(x, for_gpu: bool):
    """The tanh GELU (``gelu_new``: Google's BERT repository's and GPT-2's) in float32, returned in ``x``'s dtype;
    its gradient keeps only ``x``. ``for_gpu``: computed in ``x``'s dtype, as ``jax.nn.gelu`` writes it.

    The GPU's form is the one XLA's GEMM rewriter recognises on a matmul's output: where the pre-activation is kept
    for the backward pass and nothing else, cuBLASLt computes bias and GELU in the GEMM's epilogue, in float32 from
    the accumulator (``BIAS_GELU_AUX``: the feed-forward GEMM writes the activation and its input; no GELU kernel
    runs). Computed in float32 it is not recognised, nor where JAX's autodiff keeps the tanh's intermediates.
    Elsewhere a bfloat16 form would round each of its steps (19% of outputs off the float32 answer on a CPU)."""
    if for_gpu:
        return jax.nn.gelu(x, approximate=True)
    return jax.nn.gelu(x.astype(jnp.float32), approximate=True).astype(x.dtype)


def _tanh_gelu_forward(x, for_gpu):
    return tanh_gelu(x, for_gpu), x


def _tanh_gelu_backward(for_gpu, x, grad):
    # (1 + tanh u) / 2 = sigmoid(2u), and 1 - tanh(u)^2 = 4 sigmoid(2u) sigmoid(-2u): no cancellation where tanh ~ -1.
    # Both sigmoids from one exponential and one division (a = exp(-|2u|) never overflows; sigmoid(2u) sigmoid(-2u) =
    # a / (1 + a)^2 either side of 0). With two of each this was the GPU's largest kernel that is not a matmul: 0.27
    # ms per block of BERT-base at batch 256 on an H200, at half the card's memory rate (its arithmetic, by count)
    x32 = x.astype(jnp.float32)
    twice = 2 * _TANH_SCALE * (x32 + _TANH_CUBIC * x32 * x32 * x32)
    a = jnp.exp(-jnp.abs(twice))
    r = 1.0 / (1.0 + a)
    cdf = jnp.where(twice >= 0, r, a * r)
    slope = cdf + 2 * x32 * (a * r * r) * _TANH_SCALE * (1.0 + 3 * _TANH_CUBIC * x32 * x32)
    return ((grad.astype(jnp.float32) * slope).astype(x.dtype),)


tanh_gelu.defvjp(_tanh_gelu_forward, _tanh_gelu_backward)


class LayerNorm(keras.layers.LayerNormalization):
    """Keras's LayerNormalization (the same weights, float32 arithmetic, result in the compute dtype) with the row's
    mean and mean square reduced in one pass over the input (the variance their difference, as flax's
    ``use_fast_variance``), where Keras's reduces the mean and then the squared deviations from it: compiled for an
    H100, each norm's forward reads its input twice instead of three times (BERT-base's step: 44.1 -> 43.1 ms
    estimated). The variance is a difference of moments taken about the row's first value (not about 0), so a row
    whose mean dwarfs its spread loses no more digits than Keras's two passes do."""

    def one_pass_applies(self, inputs) -> bool:
        """Whether this norm is what the one-pass form computes: centred (not RMS), over the last axis alone."""
        axes = self.axis if isinstance(self.axis, list | tuple) else [self.axis]
        return not self.rms_scaling and [a % inputs.ndim for a in axes] == [inputs.ndim - 1]

    def kernels_apply(self, inputs, mesh=None) -> bool:
        """Whether this norm of ``inputs`` compiled for ``mesh`` is :mod:`.gpu_layer_norm`'s kernels."""
        return self.one_pass_applies(inputs) and self.scale and gpu_layer_norm.applies(mesh)  # scale: a gamma

    def call(self, inputs, mesh=None, bias=None):
        """``mesh``: the devices compiled for (None: this process's); on a GPU of compute capability 8.0+ the norm is
        :mod:`.gpu_layer_norm`'s two Pallas kernels (``TPU_PRETRAIN_LAYERNORM``). ``bias``: added to ``inputs``
        first (a dense layer's, whose gradient the kernels then sum: :func:`.gpu_layer_norm.layer_norm`)."""
        if self.kernels_apply(inputs, mesh):
            return gpu_layer_norm.layer_norm(inputs.astype(self.compute_dtype), self.gamma.value,
                                             None if self.beta is None else self.beta.value, self.epsilon, mesh, bias)
        if bias is not None:
            inputs = add_bias(inputs, bias, target_platform(mesh) == "gpu")
        if not self.one_pass_applies(inputs):
            return super().call(inputs)
        x = inputs.astype(jnp.float32)
        # a value of the row, near its mean: the difference of moments below then loses few digits; the result does
        # not depend on which value it is, so no gradient flows through it (autodiff would add a pass for zeros)
        first = jax.lax.stop_gradient(x[..., :1])
        offset = jnp.mean(x - first, axis=-1, keepdims=True)
        variance = jnp.maximum(jnp.mean(jnp.square(x - first), axis=-1, keepdims=True) - jnp.square(offset), 0.0)
        mean = first + offset
        scale = jax.lax.rsqrt(variance + self.epsilon)
        if self.gamma is not None:
            scale = scale * self.gamma.value.astype(jnp.float32)
        shift = -mean * scale
        if self.beta is not None:
            shift = shift + self.beta.value.astype(jnp.float32)
        return (x * scale + shift).astype(self.compute_dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def shared_input_projections(x, kernels, biases, for_gpu: bool, heads: int | None = None):
    """``x @ kernel + bias`` for each pair (``biases`` None: no biases; a bias None: none for that product, and no
    reduction for its gradient), then ``x`` itself: one input projected several
    ways (the query, key and value), whose gradient adds each projection's input gradient to the running total as
    ``product + total`` when compiled ``for_gpu`` (the caller asks :func:`.devices.target_platform`). ``heads``: each
    product written as ``[..., heads, length, head_size]`` by one einsum (the splash kernel's order,
    :data:`.splash.HEADS_MAJOR`), not ``[..., length, heads * head_size]``.

    The input's gradient is four terms (three products ``grad @ kernel.T`` and what the other readers of ``x`` pass
    back through the returned ``x``). Autodiff adds them as ``total + product``; of that order the GPU compiler's
    GEMM rewriter (jax 0.10.2) folds two adds into cuBLAS's accumulation (``beta = 1``) and leaves one a kernel of its
    own, reading three activation-sized tensors and writing one; written ``product + total`` it folds all three.
    Elsewhere autodiff's order: the TPU compiler counts 1.5% more bytes per step for the GPU's (v5e, libtpu 0.0.42.1,
    BERT-base at batch 128: 67.85 GB against 66.87).
    BERT-base's step compiled for an H100: twelve kernels fewer, 43.1 -> 42.5 ms estimated
    (``benchmarks/bench_step_variants.py --compile_for h100``). Callers use the returned ``x`` for its other uses,
    so that their gradient arrives here.
    """
    biases = (None,) * len(kernels) if biases is None else biases
    return (*(_projection(x, k, b, heads) for k, b in zip(kernels, biases, strict=True)), x)


def _by_heads(kernel, heads: int):
    """``[features, heads * head_size]`` -> ``[features, heads, head_size]``."""
    return kernel.reshape(kernel.shape[0], heads, kernel.shape[1] // heads)


def _projection(x, kernel, bias, heads=None):
    if heads is None:
        product = jnp.matmul(x, kernel)
        return product if bias is None else product + bias
    product = jnp.einsum("...ld,dhk->...hlk", x, _by_heads(kernel, heads))
    return product if bias is None else product + bias.reshape(heads, 1, -1)


def _shared_input_projections_forward(x, kernels, biases, for_gpu, heads):
    return shared_input_projections(x, kernels, biases, for_gpu, heads), (x, kernels, biases)  # None stays None


def _shared_input_projections_backward(for_gpu, heads, residuals, cotangents):
    x, kernels, biases = residuals
    *grads, total = cotangents
    features, leading = x.ndim - 1, tuple(range(x.ndim - 1))
    for grad, kernel in zip(reversed(grads), reversed(kernels), strict=True):
        product = (jax.lax.dot_general(grad, kernel, (((features,), (1,)), ((), ()))) if heads is None
                   else jnp.einsum("...hlk,dhk->...ld", grad, _by_heads(kernel, heads)))
        total = product + total if for_gpu else total + product  # the order each compiler does best with
    if heads is None:
        kernel_grads = tuple(jax.lax.dot_general(x, grad, ((leading, leading), ((), ()))) for grad in grads)
        summed = leading
    else:
        kernel_grads = tuple(jnp.einsum("...ld,...hlk->dhk", x, grad).reshape(kernel.shape)
                             for grad, kernel in zip(grads, kernels, strict=True))
        summed = (*range(x.ndim - 2), x.ndim - 1)  # all but the heads and head_size axes of [..., h, l, k]
    bias_grads = None if biases is None else tuple(
        None if bias is None else jnp.sum(grad, axis=summed, dtype=jnp.float32).astype(grad.dtype).reshape(bias.shape)
        for grad, bias in zip(grads, biases, strict=True))
    return total.astype(x.dtype), kernel_grads, bias_grads


shared_input_projections.defvjp(_shared_input_projections_forward, _shared_input_projections_backward)


def add_bias(x, bias, for_gpu: bool = False):
    """``x + bias`` in ``x``'s dtype (``bias`` broadcast over ``x``'s leading axes and its own axes of size 1); in
    bfloat16 with the bias's gradient summed in float32 and rounded once to the bias's dtype. ``for_gpu`` (compiled
    for a GPU: the caller asks :func:`.devices.target_platform`): the gradient widened to float32 by its bits
    (:func:`_bfloat16_widened`), elsewhere by a conversion, which costs a TPU's fusions less (BERT-base on a v5e-8 at
    batch 256: 34.5 M cycles against 36.2 by the bits, the compiler's cost model).

    Why: autodiff sums a broadcast's gradient in the gradient's dtype, and XLA keeps a bfloat16 sum in bfloat16 on a
    Hopper GPU (H100, H200: its ``GpuFloatSupport`` takes bfloat16 adds as native from compute capability 9.0, and
    the PTX adds with ``add.rn.bf16``) and on a CPU (the running sum rounded to bfloat16 after every add), where for
    an A100 it adds in float32. A bias's gradient over BERT-base's 32,768 rows was then off by ~0.7% RMS on an H200
    (its order of adds emulated) and 1.4% on a CPU (measured), against 0.14% for a float32 sum rounded once
    (zero-mean terms; benchmarks/GPU_NOTES.md). The same bytes are read: BERT-base's step compiled for an H200 is
    unchanged (32.3 ms estimated, 668 kernels). float16 and float32 are left to autodiff: XLA adds float16 in
    float32 on every GPU (done here, a T4's step would have 22 kernels more)."""
    if jnp.broadcast_shapes(x.shape, bias.shape) != x.shape:
        raise ValueError(f"add_bias: a bias of shape {bias.shape} would broadcast x of shape {x.shape}")
    return _float32_summed_bias(x, bias, for_gpu) if x.dtype == jnp.bfloat16 else x + bias.astype(x.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _float32_summed_bias(x, bias, for_gpu):
    return x + bias.astype(x.dtype)


def _float32_summed_bias_forward(x, bias, for_gpu):
    return _float32_summed_bias(x, bias, for_gpu), bias


def _float32_summed_bias_backward(for_gpu, bias, grad):
    lead = grad.ndim - bias.ndim
    summed = (*range(lead), *(lead + i for i, n in enumerate(bias.shape) if n == 1 and grad.shape[lead + i] != 1))
    terms = _bfloat16_widened(grad) if for_gpu else grad.astype(jnp.float32)
    return grad, jnp.sum(terms, axis=summed).reshape(bias.shape).astype(bias.dtype)


def _bfloat16_widened(x):
    """bfloat16 ``x`` in float32, by its bits (a float32's 16 high bits). ``x.astype(float32)`` would be folded by
    XLA into the conversion that made ``x``, and the sum would then read the float32 value before it, which on a GPU
    split the GELU's gradient from its bias's sum (BERT-base compiled for an H200: 13 kernels, 9 GB and 2.3 ms
    more)."""
    bits = jax.lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32) << 16
    return jax.lax.bitcast_convert_type(bits, jnp.float32)


_float32_summed_bias.defvjp(_float32_summed_bias_forward, _float32_summed_bias_backward)


class Dense(keras.layers.Dense):
    """Keras's Dense (the same weights and values), its bias added by :func:`add_bias` (``for_gpu``: as there)."""

    def call(self, inputs, training=None, for_gpu: bool = False):
        x = keras.ops.matmul(inputs, self.kernel)
        if self.bias is not None:
            x = add_bias(x, keras.ops.cast(self.bias, x.dtype), for_gpu)
        return x if self.activation is None else self.activation(x)


def dense_weights(dense: keras.layers.Dense, dtype) -> tuple:
    """``(kernel, bias)``: a dense layer's weights cast to ``dtype`` (one cast each), the bias None without one."""
    return (keras.ops.cast(dense.kernel, dtype),
            None if dense.bias is None else keras.ops.cast(dense.bias, dtype))


def heads_major_parts(x, dense: keras.layers.Dense, parts: int, heads: int) -> tuple:
    """``dense(x)`` (``[..., length, features]`` by a kernel ``[features, parts * heads * head_size]``: ModernBERT's
    ``Wqkv``) as ``parts`` arrays of ``[..., heads, length, head_size]`` (the splash kernel's order,
    :data:`.splash.HEADS_MAJOR`), from one einsum with the kernel seen as ``[features, parts, heads, head_size]``:
    its gradients are one product each, and the parts are the result's leading slices (no copies)."""
    kernel, bias = dense_weights(dense, x.dtype)
    kernel = kernel.reshape(kernel.shape[0], parts, heads, kernel.shape[1] // (parts * heads))
    product = jnp.einsum("...ld,dthk->t...hlk", x, kernel)
    if bias is not None:
        product = add_bias(product, bias.reshape(parts, *(1,) * (x.ndim - 2), heads, 1, kernel.shape[-1]))
    return tuple(product[i] for i in range(parts))


def heads_output(context, dense: keras.layers.Dense, bias=None):
    """``[..., heads, length, head_size]`` (the splash kernel's order) projected by a dense layer (kernel ``[heads *
    head_size, units]``) to ``[..., length, units]`` in one einsum, no transpose first; ``bias`` (in the context's
    dtype) for the layer's own where given."""
    kernel, own = dense_weights(dense, context.dtype)
    bias = own if bias is None else bias
    heads, size = context.shape[-3], context.shape[-1]
    out = jnp.einsum("...hlk,hkd->...ld", context, kernel.reshape(heads, size, kernel.shape[-1]))
    return out if bias is None else add_bias(out, bias)
