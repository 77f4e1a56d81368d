"""The BERT-base step's largest kernels that are not matrix products, alone on a GPU: the package's Pallas LayerNorm
(forward and backward) at several tile shapes, and the tanh GELU's gradient with the feed-forward bias's in the
package's form, the form before it and as a Pallas kernel (the candidate of ``pallas_gelu.py``, at several tile
shapes); attention at length 128, forward and backward, by cuDNN as the package calls it and by the candidate of
``pallas_short_attention.py`` at several tile shapes; and how far the bias's gradient is from a float32 sum, the
package's and autodiff's (a bfloat16 sum, which XLA for a Hopper GPU adds in bfloat16).

Usage: KERAS_BACKEND=jax python benchmarks/bench_kernels_gpu.py [--json OUT.json] [--iterations 50] [--smoke]

Why: issue 42. On an H200's trace of the step (benchmarks/GPU_NOTES.md, 2026-11-28) the GELU's gradient took 0.274
ms per block at 2.2 TB/s and the norms ran at ~2.8 TB/s, where the card copies at ~4.3: a tile shape or a formula
is judged here in seconds, on the step's own shapes (32,768 rows of 768 for a norm, of 3,072 for the GELU), where a
step variant costs a compile each. Each row prints milliseconds and the rate its bytes move at (what it must read
and write once; the norm's backward without its partial sums). The package's tiles are the first norm row
(:data:`tpu_pretrain.jax_backend.gpu_layer_norm.ROWS`, ``BACKWARD_TILES``, ``WARPS``), patched for the others.
``--smoke``: small shapes on the CPU, the Pallas kernels in their interpreter (figures meaningless).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import pallas_gelu  # noqa: E402
import pallas_short_attention  # noqa: E402
from bench_step_variants import two_sigmoids_gelu  # noqa: E402
from support import kernel_time, parse_args  # noqa: E402

from tpu_pretrain.jax_backend import gpu_layer_norm  # noqa: E402
from tpu_pretrain.jax_backend.attention import fused_attention  # noqa: E402
from tpu_pretrain.jax_backend.lean_layers import add_bias, tanh_gelu  # noqa: E402

# (rows per tile, tiles per backward program, warps): the package's first
NORM_TILES = ((gpu_layer_norm.ROWS, gpu_layer_norm.BACKWARD_TILES, gpu_layer_norm.WARPS), (8, 1, 4), (8, 8, 4),
              (16, 2, 4), (16, 4, 8), (4, 8, 4))
# pallas_gelu's (rows per tile, columns per program, tiles per program, warps): the module's first
GELU_TILES = (pallas_gelu.TILES, (8, 256, 16, 4),
              (32, 128, 4, 4), (32, 256, 4, 8), (16, 512, 8, 8))
# pallas_short_attention's (queries per block, the forward's warps, the backward's): the module's first
ATTENTION_TILES = (pallas_short_attention.TILES, (64, 4, 4), (32, 4, 4), (32, 4, 8), (128, 8, 8))


def norm_rows(rows: int, width: int, iterations: int, configs: int) -> list[dict]:
    """The Pallas norm forward, and forward and backward (the input's gradient and the weights'), at the first
    ``configs`` of NORM_TILES."""
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    x = (jax.random.normal(keys[0], (rows, width)) * 2 + 1).astype(jnp.bfloat16)
    dy = jax.random.normal(keys[1], (rows, width)).astype(jnp.bfloat16)
    gamma, beta = 1 + 0.1 * jax.random.normal(keys[2], (2, width))
    activation = rows * width * 2
    out = []
    for tile, tiles, warps in NORM_TILES[:configs]:
        with mock.patch.multiple(gpu_layer_norm, ROWS=tile, BACKWARD_TILES=tiles, WARPS=warps):
            def forward(x, gamma, beta):
                return gpu_layer_norm.layer_norm(x, gamma, beta, 1e-12)

            def both(x, gamma, beta):
                y, pullback = jax.vjp(forward, x, gamma, beta)
                return y, pullback(dy)

            passes = {"forward": (forward, 2 * activation), "forward+backward": (both, 5 * activation)}
            for what, (call, moved) in passes.items():
                out.append(timed_row(f"layer_norm_rows{tile}_tiles{tiles}_w{warps}", what, call, (x, gamma, beta),
                                     moved, iterations))
    return out


def gelu_rows(rows: int, width: int, iterations: int, configs: int) -> list[dict]:
    """The tanh GELU's gradient with the bias's (XLA fuses the two), in the package's form (the bias's summed in
    float32: ``lean_layers.add_bias``), with the bias's summed by autodiff in bfloat16 (before 2026-11-29), and with
    two sigmoids; then as ``pallas_gelu``'s kernel at the first ``configs`` of GELU_TILES (the same bytes: its
    partial sums and their sum are a few MB)."""
    keys = jax.random.split(jax.random.PRNGKey(1), 2)
    pre = (jax.random.normal(keys[0], (rows, width)) * 2).astype(jnp.bfloat16)
    dy = jax.random.normal(keys[1], (rows, width)).astype(jnp.bfloat16)
    on_gpu = jax.default_backend() == "gpu"
    def gradient_of(gelu, add=add_bias):
        def gradient(pre, dy):
            _, pullback = jax.vjp(lambda h, b: gelu(add(h, b), on_gpu), pre, jnp.zeros((width,), pre.dtype))
            return pullback(dy)

        return gradient

    forms = (("one_exponential", gradient_of(tanh_gelu)), ("bfloat16_bias_sum", gradient_of(tanh_gelu, jnp.add)),
             ("two_sigmoids", gradient_of(two_sigmoids_gelu(tanh_gelu))))
    out = [timed_row(f"gelu_gradient_{name}", "backward with the bias's", gradient, (pre, dy), 3 * rows * width * 2,
                     iterations) for name, gradient in forms]
    for tiles in GELU_TILES[:configs]:
        out.append(timed_row("gelu_gradient_pallas_" + "_".join(map(str, tiles)), "backward with the bias's",
                             lambda pre, dy, tiles=tiles: pallas_gelu.gradient(pre, dy, not on_gpu, tiles),
                             (pre, dy), 3 * rows * width * 2, iterations))
    return [*out, bias_sum_error("bias_gradient_sum", forms[0][1], pre, dy),
            bias_sum_error("bias_gradient_sum_bfloat16", forms[1][1], pre, dy)]


def attention_rows(batch: int, length: int, iterations: int, configs: int) -> list[dict]:
    """BERT-base's attention (12 heads of 64), forward and backward, a quarter of the rows padded after 100 tokens:
    cuDNN's kernels as the package calls them (``fused_attention``: the key lengths; XLA's attention off a GPU), then
    ``pallas_short_attention``'s at the first ``configs`` of ATTENTION_TILES. Bytes: q, k, v and the output, and
    each one's gradient, once each way."""
    keys = jax.random.split(jax.random.PRNGKey(2), 4)
    q, k, v, do = (jax.random.normal(key, (batch, length, 12, 64)).astype(jnp.bfloat16) for key in keys)
    attend = jnp.arange(length)[None, :] < jnp.where(jnp.arange(batch) % 4 == 3, 100, length)[:, None]
    on_gpu = jax.default_backend() == "gpu"

    def forward_backward(attention):
        def call(q, k, v, do):
            out, pullback = jax.vjp(attention, q, k, v)
            return out, pullback(do)

        return call

    moved = 12 * q.size * 2
    out = [timed_row("attention_cudnn", "forward+backward", forward_backward(
        lambda q, k, v: fused_attention(q, k, v, attend)), (q, k, v, do), moved, iterations)]
    query_ids, key_ids = pallas_short_attention.ids(attend)
    no_bias = jnp.zeros((12, 64), q.dtype)  # its backward sums the biases' gradients too, which cuDNN's call does not
    for tiles in ATTENTION_TILES[:configs]:
        out.append(timed_row("attention_short_" + "_".join(map(str, tiles)), "forward+backward", forward_backward(
            lambda q, k, v, tiles=tiles: pallas_short_attention.attention(q, k, v, no_bias, no_bias, query_ids, key_ids,
                                                                          not on_gpu, tiles)),
            (q, k, v, do), moved, iterations))
    return out


def bias_sum_error(name: str, gradient, pre, dy) -> dict:
    """How far the bias's gradient is from the float32 sum of the same gradient, per column against the sum of its
    magnitudes (what a sum's rounding scales with) and, as a median, against the sum itself: the package's (summed in
    float32, rounded once) and autodiff's (a bfloat16 sum, which XLA for a Hopper GPU adds in bfloat16: ``add.rn.bf16``
    in its PTX; ~5x the package's error by an emulation of its order of adds, benchmarks/GPU_NOTES.md). For scale,
    XLA's CPU compile of autodiff's at 32,768 rows (the running sum rounded to bfloat16 after each add): 3.8e-4 and
    1.2%."""
    activation, bias = jax.jit(gradient)(pre, dy)
    terms = activation.astype(jnp.float32)
    exact, size = jnp.sum(terms, axis=0), jnp.sum(jnp.abs(terms), axis=0)
    error = jnp.abs(bias.astype(jnp.float32) - exact)
    worst, typical = float(jnp.max(error / size)), float(jnp.median(error / jnp.abs(exact)))
    print(f"{name:34} {'against a float32 sum':26} largest error {worst:.1e} of the column's sum of "
          f"magnitudes; median {typical:.1%} of its sum", flush=True)
    return {"name": name, "what": "error against a float32 sum", "of_magnitudes_max": worst,
            "of_sum_median": typical}


def timed_row(name: str, what: str, call, arguments: tuple, moved: int, iterations: int) -> dict:
    try:
        first, ms = kernel_time(call, arguments, iterations)
    except Exception as exc:  # a tile the kernel refuses costs its row only
        print(f"{name:34} {what:26} failed: {type(exc).__name__}: {str(exc).strip()[:160]}", flush=True)
        return {"name": name, "what": what, "error": f"{type(exc).__name__}: {exc}"[:400]}
    print(f"{name:34} {what:26} {ms:8.4f} ms ({moved / ms / 1e9:5.2f} TB/s of its bytes); first {first:.1f} s",
          flush=True)
    return {"name": name, "what": what, "ms": round(ms, 5), "tb_per_s": round(moved / ms / 1e9, 3),
            "first_s": round(first, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--rows", type=int, default=256 * 128, help="tokens: BERT-base at batch 256, length 128")
    parser.add_argument("--json", type=Path, default=None, help="the rows written here too")
    parser.add_argument("--norm_configs", type=int, default=len(NORM_TILES), help="how many of the norm's tiles")
    parser.add_argument("--gelu_configs", type=int, default=len(GELU_TILES), help="how many of the GELU's tiles")
    parser.add_argument("--attention_configs", type=int, default=len(ATTENTION_TILES),
                        help="how many of the short attention's tiles")
    parser.add_argument("--attention_batch", type=int, default=256, help="sequences of 128 for attention")
    args = parse_args(parser, smoke={"iterations": 2, "rows": 40, "norm_configs": 2, "gelu_configs": 2,
                                     "attention_configs": 2, "attention_batch": 2},
                      what="40 rows and two sequences on the CPU, two tiles of each kernel, Pallas interpreted")
    print(f"device: {jax.devices()[0].device_kind}; jax {jax.__version__}; {args.rows} rows", flush=True)
    rows = (norm_rows(args.rows, 768, args.iterations, args.norm_configs)
            + gelu_rows(args.rows, 3072, args.iterations, args.gelu_configs)
            + attention_rows(args.attention_batch, 128, args.iterations, args.attention_configs))
    if args.json:
        args.json.write_text(json.dumps({"device": jax.devices()[0].device_kind, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
