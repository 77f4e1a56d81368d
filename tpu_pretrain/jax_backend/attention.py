"""Attention for the JAX models: which path computes it, and each path.

The paths (:data:`ATTENTION_PATHS`): ``jax.nn.dot_product_attention`` with cuDNN's fused kernel on a GPU of compute
capability 8.0+ in bfloat16 or float16, and with XLA's implementation on TPUs and CPUs; on another GPU (the free T4,
whose 16-bit fused attention cuDNN refuses only on the card, after tracing) the explicit path; the softmax in
float32 on every path. That function has no dropout on the attention probabilities, so a training call with
``attention_probs_dropout_prob > 0`` (BERT's original recipe) takes the explicit matmul-softmax-dropout-matmul path;
with no attention dropout (the modern recipe) training and inference both take the fused path. On a TPU (or
compiled for one) ``auto`` takes JAX's splash attention kernel (:mod:`.splash`) at lengths that are multiples of 128
from 256 up, and XLA's at 128 (fewer cycles there by the TPU compiler's cost model: :mod:`.splash` says why).
"""

from __future__ import annotations

import logging
import math
import warnings

import jax
import jax.numpy as jnp

from ..environment import override_choice
from ..errors import UserInputError
from . import splash
from .devices import compute_at_least, target_device, target_platform
from .documents import document_ids

# cuDNN's fused attention in 16 bits needs an Ampere or newer GPU; JAX does not check, and on an older one (the free
# T4: 7.5) cuDNN refuses the graph only when XLA builds it on the card, after tracing
CUDNN_ATTENTION_CAPABILITY = 8.0
MASK_BIAS = -1e9  # added to the attention scores of padding: exp() of it is exactly 0
# How the blocks compute attention. auto: cuDNN's fused kernel where it applies (a CUDA GPU of compute capability
# 8.0+, bfloat16 or float16 inputs, head size a multiple of 8), on another GPU explicit, else XLA's; xla:
# jax.nn.dot_product_attention's XLA implementation; cudnn: cuDNN's kernel or an error; explicit: matmul, softmax,
# dropout, matmul as Google's BERT writes it; splash: the TPU kernel (Pallas's interpreter off a TPU: tests). auto
# takes splash where it applies (:func:`.splash.applies`).
ATTENTION_PATHS = ("auto", "xla", "cudnn", "explicit", "splash")
log = logging.getLogger(__name__)


def attention_path(setting: str | None = None) -> str:
    """The attention path asked for: ``setting``, else ``TPU_PRETRAIN_ATTENTION``, else ``auto``."""
    return override_choice("TPU_PRETRAIN_ATTENTION", ATTENTION_PATHS, "attention path", setting)


def cudnn_applies(dtype, head_size: int, mesh=None) -> bool:
    """Whether cuDNN's fused attention can take these inputs on the GPU compiled for (:func:`target_device`)."""
    return (target_platform(mesh) == "gpu" and compute_at_least(target_device(mesh), CUDNN_ATTENTION_CAPABILITY)
            and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16) and head_size % 8 == 0 and head_size <= 128)


def check_cudnn_capability(mesh=None) -> None:
    """Refuse the ``cudnn`` path on a GPU older than cuDNN's fused attention takes, before compiling a step that
    would fail on the card."""
    device = target_device(mesh)
    if device.platform == "gpu" and not compute_at_least(device, CUDNN_ATTENTION_CAPABILITY):
        raise UserInputError(
            f"TPU_PRETRAIN_ATTENTION=cudnn: cuDNN's fused attention needs a GPU of compute capability "
            f"{CUDNN_ATTENTION_CAPABILITY} or newer (A100, L4, H100); this {device.device_kind} has "
            f"{getattr(device, 'compute_capability', 'an unknown one')}. Use auto (the explicit path here) or xla.")


_CUDNN_REFUSED: set[str] = set()
_SAID: set[str] = set()


def say_path(what: str) -> None:
    """Log once per process which attention path a model's layers take (traced once per compile)."""
    if what not in _SAID:
        _SAID.add(what)
        log.info("Attention: %s.", what)


def attention_mask(attend, documents=None, window: int | None = None, rows=None):
    """``[batch, 1, queries or 1, keys]`` (bool): keys that are not padding, of the query's document (``documents``
    from :func:`.documents.document_ids`, None: any) and at most ``window`` positions away (None: any). ``rows``:
    ``[batch, n]``, the queries' positions where they are not every position (a block at the loss's rows)."""
    mask = attend[:, None, None, :]
    if documents is not None:
        own = documents if rows is None else jnp.take_along_axis(documents, rows, axis=1)
        mask = mask & (own[:, :, None] == documents[:, None, :])[:, None]
    if window is not None:
        keys = jnp.arange(attend.shape[1])
        queries = keys[None, :] if rows is None else rows
        mask = mask & (jnp.abs(queries[:, :, None] - keys[None, None, :]) <= window)[:, None]
    return mask


def takes_splash(path: str, length: int, head_size: int, mesh=None) -> bool:
    """Whether :func:`masked_attention` runs the splash kernel on ``length`` tokens of heads of ``head_size`` along
    ``path``: ``auto`` where :func:`.splash.applies`, and where this JAX's kernel takes those heads only padded
    (:func:`.splash.kernel_head_size`: Kaggle's image) from :data:`.splash.SHORTEST_PADDED` tokens up."""
    if path == "splash":
        return True
    if path != "auto" or not splash.applies(length, mesh):
        return False
    size = splash.kernel_head_size(head_size)
    if size == head_size or length >= splash.SHORTEST_PADDED:
        return True
    say_path(f"XLA's (this JAX's splash kernel, {jax.__version__}, takes heads of size {head_size} only padded to "
             f"{size}, which pays from {splash.SHORTEST_PADDED} tokens)")
    return False


def masked_attention(q, k, v, attend, documents=None, window=None, path: str = "auto", mesh=None,
                     heads_major: bool = False):
    """Attention under padding, documents and a window: the splash kernel where ``path`` takes it (segment ids:
    ``documents``, else padding against the rest), else :func:`fused_attention` under the same mask.
    ``heads_major``: ``q``, ``k``, ``v`` and the result are ``[batch, heads, length, head_size]``, the splash
    kernel's order (:data:`.splash.HEADS_MAJOR`; the kernel's path only)."""
    if takes_splash(path, q.shape[2 if heads_major else 1], q.shape[-1], mesh):
        size, padded = q.shape[-1], splash.kernel_head_size(q.shape[-1])
        say_path(f"splash kernel ({'sliding window, ' if window else ''}"
                 f"{'documents apart' if documents is not None else 'documents together'}"
                 f"{f', heads of {size} padded to {padded} for this JAX' if padded != size else ''})")
        segments = document_ids(None, attend, None) if documents is None else documents
        return splash.attention(q, k, v, segments, window, mesh, heads_major=heads_major)
    if heads_major:
        raise ValueError(f"attention path {path!r} on {q.shape[2]} tokens is not the splash kernel: heads-major "
                         "inputs are the kernel's alone")
    return fused_attention(q, k, v, attend, path, documents, window, mesh)


def fused_attention(q, k, v, attend, path: str = "auto", documents=None, window=None, mesh=None):
    """Scaled dot-product attention of ``[batch, length, heads, head_size]`` arrays under :func:`attention_mask`
    (padding where ``attend`` is False, other ``documents``, beyond ``window``): ``jax.nn.dot_product_attention``.

    cuDNN's kernel where it applies (a CUDA GPU of compute capability 8.0+, 16-bit inputs): padding alone as key
    lengths (the count of True in ``attend``, at least 1: the same mask, since BERT's padding is trailing),
    documents or a window as the mask, which the kernel adds as a bias without a ``[batch, heads, length, length]``
    tensor in memory. On another GPU (a T4: float16, compute capability 7.5) ``auto`` takes
    :func:`explicit_attention`: scores in the inputs' dtype, as the TensorFlow backend and NVIDIA's float16 BERT
    compute them, where XLA's implementation writes them in float32 and transposes around its matrix products
    (a T4's BERT-base step compiled both ways: 197.5 -> 181.0 ms estimated). Elsewhere XLA's implementation with the
    boolean mask, logits accumulated and the softmax computed in float32. Each returns the inputs' dtype.
    ``mesh``: the devices compiled for (None: this process's).
    """
    padding_only = documents is None and window is None
    if path == "cudnn":
        check_cudnn_capability(mesh)
    if path == "cudnn" or (path == "auto" and cudnn_applies(q.dtype, q.shape[-1], mesh)):
        try:
            if padding_only:
                lengths = jnp.maximum(jnp.sum(attend, axis=1, dtype=jnp.int32), 1)
                return jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=lengths, implementation="cudnn")
            say_path("cuDNN's fused kernel under the document/window mask")
            return jax.nn.dot_product_attention(q, k, v, mask=attention_mask(attend, documents, window),
                                                implementation="cudnn")
        except (NotImplementedError, ValueError, RuntimeError) as error:
            if path == "cudnn":
                raise
            if str(error) not in _CUDNN_REFUSED:
                _CUDNN_REFUSED.add(str(error))
                warnings.warn(f"cuDNN fused attention refused these inputs ({error}); using the explicit path.",
                              stacklevel=2)
    if path == "auto" and target_platform(mesh) == "gpu":
        say_path(f"explicit (cuDNN's fused kernel does not take {q.dtype} inputs of head size {q.shape[-1]} on a "
                 f"{target_device(mesh).device_kind})")
        return explicit_attention(q, k, v, attend if padding_only else attention_mask(attend, documents, window))
    mask = attend[:, None, None, :] if padding_only else attention_mask(attend, documents, window)
    if q.dtype == jnp.float16 and target_platform(mesh) != "gpu":
        # the function asks XLA for float16 dots with float32 results (F16_F16_F32), which CPUs and TPUs refuse at
        # compile time: float16 there (the tests' stand-in for a T4) computes attention in float32
        return jax.nn.dot_product_attention(*(t.astype(jnp.float32) for t in (q, k, v)), mask=mask,
                                            implementation="xla").astype(q.dtype)
    return jax.nn.dot_product_attention(q, k, v, mask=mask, implementation="xla")


def explicit_attention(q, k, v, mask, dropout=None, training=False, float32_scores=False):
    """The same attention written out (Google BERT's order): scores in the inputs' dtype (``float32_scores``: in
    float32, as the fused kernels keep them), softmax in float32 with :data:`MASK_BIAS` added where ``mask``
    (:func:`attention_mask`) is False, ``dropout`` (a Keras layer) on the probabilities, then the weighted sum. A
    ``[batch, length]`` mask is padding alone; the queries may be fewer than the keys."""
    mask = mask[:, None, None, :] if mask.ndim == 2 else mask
    q, k, v = (jnp.transpose(t, (0, 2, 1, 3)) for t in (q, k, v))
    qs, ks = (q.astype(jnp.float32), k.astype(jnp.float32)) if float32_scores and q.dtype == jnp.float16 else (q, k)
    # float16 products with float32 results are refused by CPUs' and TPUs' compilers: float16 is cast first
    scores = jnp.matmul(qs, jnp.transpose(ks, (0, 1, 3, 2)),
                        preferred_element_type=jnp.float32 if float32_scores else None) / math.sqrt(q.shape[-1])
    bias = jnp.where(mask, 0.0, MASK_BIAS).astype(jnp.float32)
    probs = jax.nn.softmax(scores.astype(jnp.float32) + bias, axis=-1).astype(q.dtype)
    if dropout is not None:
        probs = dropout(probs, training=training)
    return jnp.transpose(jnp.matmul(probs, v), (0, 2, 1, 3))
