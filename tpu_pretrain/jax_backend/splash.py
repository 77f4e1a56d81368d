"""Attention on a TPU by the splash attention kernel that ships inside JAX (``jax.experimental.pallas.ops.tpu.
splash_attention``): a maintained Pallas kernel that never materialises the score matrix, so ModernBERT's lengths
(1,024, 8,192) fit on a chip where XLA's attention holds every ``[heads, length, length]`` matrix.

One kernel per (length, heads, window, block sizes) is built, as the API wants, from a ``MultiHeadMask`` of the
same static mask for every head: ``FullMask`` for global attention, ``LocalMask`` with ``(window, window)`` for
ModernBERT's sliding window (transformers' rule ``|q - k| <= local_attention // 2``). Documents and padding come in
as the kernel's ``SegmentIds`` (a token attends only to tokens of its own segment; padding is a segment of its
own), so the kernel computes what :func:`.attention.fused_attention`'s XLA path computes with the same document mask at
every real token (padding's own outputs differ and are never read). The kernel has no scale: queries are scaled by
``1 / sqrt(head_size)`` first, in float32. It runs per example (``vmap``), and over a mesh of several chips inside
``shard_map`` (the examples split over the chips), so every chip runs the kernel on its own examples.

Block sizes: the largest of 512, 256, 128 that divides the length (the kernel needs multiples of 128); a length
that is not a multiple of 128 cannot take the kernel. ``auto`` takes it from :data:`SHORTEST` tokens up
(:func:`applies`): at 128, BERT's own length, XLA's attention is the faster path by the TPU compiler's own cost model
(its ``estimated_cycles`` summed over the step: ``benchmarks/bench_step_variants.py --compile_for v5e-1 --variants
base splash_attention``). BERT-base at 128, batch 128, on a v5e-1 (jax 0.12.0.1, libtpu 0.0.50.1): 124.3 M cycles
for the step outside the kernel against 127.3 M for the whole step on XLA's path, so the kernel would have to run
its ~0.32 TFLOP per step at 81% of the chip's peak, half of it contracting over the head size (64 of the MXU's 128
rows); it also saves its log-sum-exp as ``[length, 128 lanes]`` float32, as large as the score matrix at 128. At
256 (batch 64) the kernel's path is 125.6 M plus the kernel against 151.9 M, at 512 (batch 32) 125.4 M plus the
kernel against 195.2 M. Estimates, not measurements: there is no TPU here (docs/tpus.md has the table).

Off a TPU, ``interpret=True`` runs the same kernel in Pallas's interpreter (slow; tests only). Tolerances against the
XLA path with the same masks, measured by ``tests/jax_backend/test_splash_attention.py``: float32 forward 2e-5 and
gradients 1e-4 (max absolute difference over unit-scale inputs); bfloat16 forward 2e-2 and gradients 6e-2 (the
kernel rounds the probabilities to bfloat16 before the weighted sum, as XLA's path does, but in other blocks and
order).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as kernels
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks
from jax.sharding import PartitionSpec

from .devices import per_device, target_platform

LANES = 128  # the kernel's blocks are multiples of this
BLOCKS = (512, 256, 128)
SHORTEST = 256  # auto's shortest length for the kernel: below it XLA's attention costs the step fewer cycles
SHORTEST_PADDED = 512  # the same where this JAX's kernel takes the heads only padded (:func:`kernel_head_size`)
# The kernel reads the queries, keys and values with the length on the chip's 128 lanes, not the head size (64 lanes
# of 128 were padding, and XLA's copies into that layout cost more). One BERT-base layer's forward and backward at
# 512 tokens, batch 32, on a v5e by the TPU compiler's cost model (the kernel's own time not counted): 4.95 -> 4.15 M
# cycles, 395 -> 315 MiB of temporaries; ModernBERT-base's step at 1,024 on a v5e-8 (32 per chip) 1,035.9 -> 805.1 M.
QKV_LAYOUT = kernels.QKVLayout.SEQ_MINOR
# The models project their inputs straight into the kernel's order, ``[batch, heads, length, head_size]`` (an einsum
# per projection), and project its output from that order, where they made ``[batch, length, hidden]`` products and
# reshaped and transposed them into it and out (copies XLA writes out). BERT-base's step at 512, batch 32, v5e-1, by
# the TPU compiler's cost model, the kernel's own time not counted: 140.3 -> 125.4 M cycles (copies 22.1 -> 7.8 M);
# ModernBERT-base's at 1,024 on a v5e-8 (32 per chip): 805.1 -> 615.3 M, 1.31x.
HEADS_MAJOR = True


def applies(length: int, mesh=None) -> bool:
    """Whether ``auto`` takes the kernel at ``length``: compiled for a TPU, the length a multiple of 128 and at least
    :data:`SHORTEST` (the module's docstring says why); the head size is :func:`takes_head_size`'s question."""
    return target_platform(mesh) == "tpu" and length % LANES == 0 and length >= SHORTEST


@functools.lru_cache(maxsize=8)
def takes_head_size(head_size: int) -> bool:
    """Whether this JAX's kernel takes heads of ``head_size``: jax 0.6.2's (Kaggle's TPU image) wants a multiple of
    128 and refuses BERT-base's and ModernBERT-base's 64 as it traces (NotImplementedError); jax 0.7.2's (Colab's)
    and later take any. Asked of the kernel itself: its forward and backward traced on one block, shapes only."""
    run = kernel(LANES, 1, None, target_platform() != "tpu")
    q = jax.ShapeDtypeStruct((1, LANES, head_size), jnp.bfloat16)  # [heads, length, head_size]
    ids = kernels.SegmentIds(q=jax.ShapeDtypeStruct((LANES,), jnp.int32), kv=jax.ShapeDtypeStruct((LANES,), jnp.int32))
    try:
        jax.eval_shape(jax.grad(lambda q, ids: run(q, q, q, ids).astype(jnp.float32).sum()), q, ids)
    except NotImplementedError:
        return False
    return True


def kernel_head_size(head_size: int) -> int:
    """The head size the kernel runs heads of ``head_size`` at: their own where this JAX's kernel takes it
    (:func:`takes_head_size`), else zero-padded to the next multiple of 128, which leaves the scores and the outputs'
    own columns as they are. On a v5e the padded products take the MXU's passes the unpadded ones took (a contraction
    over 64 fills half its 128 rows either way); the padding and the slice back cost copies: BERT-base's step at
    512 tokens, batch 32, v5e-1, 125.6 -> 146.4 M cycles by the TPU compiler's cost model (XLA's attention: 195.2),
    temporaries 3.8 -> 4.5 GiB. So ``auto`` takes the padded kernel from :data:`SHORTEST_PADDED` tokens up."""
    return head_size if takes_head_size(head_size) else -(-head_size // LANES) * LANES


def block_size(length: int) -> int:
    """The kernel's query and key block: the largest of :data:`BLOCKS` dividing ``length``."""
    for block in BLOCKS:
        if length % block == 0:
            return block
    raise ValueError(f"splash attention needs a length that is a multiple of {LANES}, not {length}; use the XLA "
                     "path (TPU_PRETRAIN_ATTENTION=xla) or a max_seq_length that is a multiple of 128.")


@functools.lru_cache(maxsize=32)
def kernel(length: int, heads: int, window: int | None, interpret: bool):
    """The multi-head kernel for one example: ``(q, k, v [heads, length, head_size], segment_ids) -> out``."""
    shape = (length, length)
    one = masks.FullMask(shape) if window is None else masks.LocalMask(shape, (window, window), offset=0)
    block = block_size(length)
    sizes = kernels.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                               block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block,
                               q_layout=QKV_LAYOUT, k_layout=QKV_LAYOUT, v_layout=QKV_LAYOUT)
    # built outside any trace: the kernel keeps its mask's blocks as arrays, which a build inside a jit's trace would
    # make that trace's values (jax 0.7.2 and later stage jnp.array there), and this cache would hand them on
    with jax.ensure_compile_time_eval():
        return kernels.make_splash_mha(masks.MultiHeadMask([one] * heads), block_sizes=sizes, head_shards=1,
                                       q_seq_shards=1, interpret=interpret)


def attention(q, k, v, segments, window: int | None = None, mesh=None, axis: str | None = None,
              heads_major: bool = False):
    """Scaled dot-product attention of ``[batch, length, heads, head_size]`` arrays (``heads_major``: ``[batch,
    heads, length, head_size]``, the kernel's own order, in and out: :data:`HEADS_MAJOR`) in which a token attends
    only to tokens of its own segment (``segments``: ``[batch, length]`` int32) within ``window`` positions (None:
    all); the inputs' dtype out. ``mesh`` with more than one device: run per chip, the examples split along ``axis``."""
    _, heads, length, head_size = q.shape if heads_major else (q.shape[0], q.shape[2], q.shape[1], q.shape[3])
    interpret = target_platform(mesh) != "tpu"
    run = kernel(length, heads, window, interpret)
    scale = 1.0 / float(head_size) ** 0.5
    q = (q.astype(jnp.float32) * scale).astype(q.dtype)
    padding = [(0, 0)] * 3 + [(0, kernel_head_size(head_size) - head_size)]

    def per_example(q, k, v, segments):
        if not heads_major:
            q, k, v = (jnp.swapaxes(t, 1, 2) for t in (q, k, v))  # [batch, heads, length, head_size]
        if padding[-1][1]:
            q, k, v = (jnp.pad(t, padding) for t in (q, k, v))
        ids = kernels.SegmentIds(q=segments, kv=segments)
        out = jax.vmap(run, in_axes=(0, 0, 0, kernels.SegmentIds(q=0, kv=0)))(q, k, v, ids).astype(v.dtype)
        out = out[..., :head_size]
        return out if heads_major else jnp.swapaxes(out, 1, 2)

    segments = segments.astype(jnp.int32)
    if mesh is None or mesh.devices.size == 1:
        return per_example(q, k, v, segments)
    spec = PartitionSpec(axis or mesh.axis_names[0])
    return per_device(per_example, mesh, (spec, spec, spec, spec), spec)(q, k, v, segments)
