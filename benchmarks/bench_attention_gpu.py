"""Attention alone on a GPU, forward and backward: the package's cuDNN paths against XLA's and against JAX's Pallas
(Triton) flash attention at several tile sizes, for BERT-base at length 128 and ModernBERT-base at 1,024.

Usage: KERAS_BACKEND=jax python benchmarks/bench_attention_gpu.py [--json OUT.json] [--iterations 30] [--smoke]

Why: issue 42. On the H100's traces cuDNN's fused attention took 5.2 ms of a 47 ms BERT-base step at length 128,
about 100 TFLOP/s where the GEMMs run at 720: the largest part of the step that is not a matrix product. Two
replacements were measured inside the whole step (XLA's attention 0.81x, Pallas's at its default tiles 0.95x); this
times the attention call alone, so that a tile size or a mask form can be judged in seconds, not one step compile
each. Rows: ``cudnn_lengths`` (the package's path for padding: key lengths), ``cudnn_plain`` (no mask: the bound of
what the mask costs), ``cudnn_documents`` (the command's path, documents apart: the mask as cuDNN's bias), ``xla``
(the mask materialised) and ``pallas_Q_K_DKV_DQ_wW_sS`` (the forward's query and key tiles, the backward's tiles,
warps, stages; segment ids keep documents apart). FLOPs: the forward's two products, the backward counted as 2.5
times them (it recomputes the scores), as :mod:`tpu_pretrain.models.bert_config` counts attention.
``--smoke``: tiny shapes on the CPU, the Pallas kernels in their interpreter, the cuDNN rows skipped.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from support import kernel_time, parse_args  # noqa: E402

from tpu_pretrain.jax_backend.attention import fused_attention  # noqa: E402

# (block_q, block_k, backward tiles, warps, stages): the Pallas default first, then larger backward tiles
PALLAS_TILES = ((128, 128, 32, None, 2), (128, 128, 64, None, 2), (128, 128, 64, 8, 2), (128, 128, 128, 8, 2),
                (64, 128, 64, 4, 2), (128, 64, 64, 4, 3))
# name: (batch, length, heads, head size, documents per row)
SHAPES = {"bert_base_l128": (256, 128, 12, 64, 1), "modernbert_base_l1024": (32, 1024, 12, 64, 4)}
SMOKE_SHAPES = {"bert_smoke": (2, 32, 2, 16, 1), "documents_smoke": (2, 64, 2, 16, 2)}


def inputs(batch: int, length: int, heads: int, size: int, documents: int, dtype):
    """q, k, v, ``attend`` (no padding) and document ids (``documents`` equal runs per row, 1, 2, ...)."""
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    q, k, v = (jax.random.normal(key, (batch, length, heads, size), dtype) for key in keys)
    attend = jnp.ones((batch, length), bool)
    ids = 1 + jnp.arange(length, dtype=jnp.int32) * documents // length
    return q, k, v, attend, jnp.broadcast_to(ids, (batch, length))


def pallas_call(tiles, interpret: bool):
    """Pallas's Triton flash attention at ``tiles`` (see :data:`PALLAS_TILES`), documents as segment ids."""
    from jax.experimental.pallas.ops.gpu import attention as triton_attention

    block_q, block_k, backward, warps, stages = tiles
    blocks = triton_attention.BlockSizes(block_q=block_q, block_k=block_k, block_q_dkv=backward,
                                         block_kv_dkv=backward, block_q_dq=backward, block_kv_dq=backward)

    def call(q, k, v, attend, documents):
        segments = jnp.where(attend, documents, 0)
        return triton_attention.mha(q, k, v, segments, sm_scale=q.shape[-1] ** -0.5, block_sizes=blocks,
                                    num_warps=warps, num_stages=stages, interpret=interpret)

    return call


def candidates(on_gpu: bool, documents: bool) -> dict:
    """name -> attention(q, k, v, attend, documents), the rows this shape and device can run."""
    rows = {}
    if on_gpu:
        if not documents:
            rows["cudnn_lengths"] = lambda q, k, v, a, d: fused_attention(q, k, v, a, "cudnn")
        rows["cudnn_plain"] = lambda q, k, v, a, d: jax.nn.dot_product_attention(q, k, v, implementation="cudnn")
        if documents:
            rows["cudnn_documents"] = lambda q, k, v, a, d: fused_attention(q, k, v, a, "cudnn", documents=d)
    rows["xla"] = lambda q, k, v, a, d: fused_attention(q, k, v, a, "xla", documents=d if documents else None)
    for tiles in PALLAS_TILES:
        name = "pallas_{}_{}_{}_w{}_s{}".format(*(t or "auto" for t in tiles))
        rows[name] = pallas_call(tiles, interpret=not on_gpu)
    return rows


def timed(attention, arrays, iterations: int) -> tuple[float, float]:
    """(seconds to compile and run once, milliseconds per forward and backward) of ``attention``."""
    q, k, v, attend, documents = arrays
    cotangent = jax.random.normal(jax.random.PRNGKey(1), q.shape, q.dtype)

    def forward_backward(q, k, v):
        out, pullback = jax.vjp(lambda q, k, v: attention(q, k, v, attend, documents), q, k, v)
        return out, pullback(cotangent)

    return kernel_time(forward_backward, (q, k, v), iterations)


def reference(arrays):
    """The float32 attention under the same mask: each row's largest error is measured against it."""
    q, k, v, attend, documents = (a.astype(jnp.float32) if a.dtype == jnp.bfloat16 else a for a in arrays)
    return fused_attention(q, k, v, attend, "xla", documents=documents)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--json", type=Path, default=None, help="the rows written here too")
    args = parse_args(parser, smoke={"iterations": 2}, what="tiny shapes on the CPU, Pallas interpreted, no cuDNN")
    on_gpu = jax.default_backend() == "gpu"
    shapes = SMOKE_SHAPES if args.smoke else SHAPES
    print(f"device: {jax.devices()[0].device_kind}; jax {jax.__version__}", flush=True)
    rows = []
    for shape, (batch, length, heads, size, documents) in shapes.items():
        arrays = inputs(batch, length, heads, size, documents, jnp.bfloat16)
        flops = 3.5 * 4 * batch * length * length * heads * size
        expected = reference(arrays)
        for name, attention in candidates(on_gpu, documents > 1).items():
            try:
                first, ms = timed(attention, arrays, args.iterations)
                error = float(jnp.max(jnp.abs(attention(*arrays).astype(jnp.float32) - expected)))
            except Exception as exc:  # a tile the kernel refuses costs its row only
                print(f"{shape:22} {name:28} failed: {type(exc).__name__}: {str(exc).strip()[:160]}", flush=True)
                rows.append({"shape": shape, "name": name, "error": f"{type(exc).__name__}: {exc}"[:400]})
                continue
            rows.append({"shape": shape, "name": name, "ms": round(ms, 4), "tflops": round(flops / ms / 1e9, 1),
                         "first_s": round(first, 1), "max_error": error})
            print(f"{shape:22} {name:28} {ms:8.3f} ms forward+backward ({flops / ms / 1e9:6.1f} TFLOP/s); first "
                  f"{first:.1f} s; largest error against float32 {error:.2e}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"device": jax.devices()[0].device_kind, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
