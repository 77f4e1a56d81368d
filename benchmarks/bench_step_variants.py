"""Variants of the JAX training step side by side in one process: changes to try, and changes made, undone.

Usage: PYTHONPATH=KERAS_WHEELS python benchmarks/bench_step_variants.py [--variants base keras_gelu remat ...]
           [--xla_flags FLAGS] [--compile_for v5e-1|cpu|h100] [--model_size L12-H768] [--batch 256] [--steps 40]
           [--rounds 2] [--smoke]

Each variant builds the JAX trainer as ``bench_train_jax.py`` does (random data, 20 steps per call) with one change
made from here (the package is patched in this process only); all are built and compiled first, then timed in turns,
``--rounds`` of them, each variant a turn per round (:func:`timed_in_turns`), so that a card's clock drifting over
the minutes falls on all alike and each round sets every variant beside ``base``. It prints sequences/s, how far
the rounds spread, the first call (the compile) and the mean loss of the timed steps, which must agree with
``base``'s to bfloat16's precision, then each variant against ``base``: the median of the rounds' ratios and their
range (on a CPU the rounds spread ~20% and their ratios ~2%). Before the timing, what one block's forward keeps for
its backward under each (:func:`kept_for_backward`, bytes per token):

- ``base``: the package as it is.
- ``keras_gelu``: the package before the GELUs' hand-written gradients (``lean_layers.exact_gelu``, ``tanh_gelu``):
  Keras's exact GELU and JAX's autodiff of it, whose forward writes three activation-sized tensors for the backward. The
  GELU's two passes took 8.2 ms of a 53 ms step on an H100 (benchmarks/GPU_NOTES.md). Two earlier forms of the
  ``custom_vjp`` took the bias in too: with the gradient in float32 it measured -1% on the H100 (its backward wrote
  float32); with it in bfloat16, compiled for an H100 here, the forward became two kernels (XLA's ``erfc`` form of
  ``jax.nn.gelu`` reads its input many times, so the compiler would not fuse the scaled input into it) and the estimate
  did not move. The package's form (float32 ``erf``, the bias left in the GEMM's epilogue): estimated 1.061x this one
  (below).
- ``keras_layernorm``: Keras's LayerNormalization for the package's (``lean_layers.LayerNorm``: the row's mean and mean
  square in one pass), whose forward reduces the mean, then the squared deviations from it, then normalises: three
  passes over the input, two kernels of them reductions.
- ``autodiff_loss``: JAX's autodiff of ``log_softmax`` and ``take_along_axis`` for the package's cross-entropy
  (``step.loss_and_prediction``, whose gradient is ``softmax - one_hot`` in one pass): a scatter into a zeroed
  ``[predictions, vocabulary]`` tensor and several passes over the float32 logits.
- ``autodiff_qkv``: JAX's autodiff of the query, key and value projections for the package's
  (``lean_layers.shared_input_projections``, whose backward adds each input gradient to the running total as
  ``product + total``): of autodiff's order (``total + product``) the GPU compiler folds two of the three adds into
  the GEMMs' accumulation and leaves one per block a kernel (estimated 43.1 -> 42.5 ms for the package's, below).
- ``norm_per_gradient``: the global norm (for clipping) summed gradient by gradient, where the package's
  (``step.global_norm``) joins the small ones into one vector first: 127 reduction kernels more on a GPU.
- ``dot_merger``: XLA's dot merger left on, as it is by default; the package turns it off for a GPU's steps
  (``Devices.jit_options``): jax 0.11.2 joined each block's query and key projections, taking their biases out of
  cuBLAS's epilogue and concatenating their gradients (44.0 -> 42.2 ms estimated under 0.11.2; measured
  on an H100, 0.984x the package's).
- ``triton_gemm``: XLA's Triton GEMMs left on, as they are by default; the package turns them off for a GPU's steps:
  where the autotuner picked cuBLAS for a GEMM XLA had wrapped as a Triton fusion, the GEMM came back without the bias
  cuBLAS's epilogue adds (the H100's step of 2026-11-27 added the query, key and value biases in 36 kernels, 1.3 ms).
  A compile without the GPU does not autotune and keeps the epilogue either way: only the card can measure it (an
  H100: 0.949x, i.e. the package's 1.054x).
- ``keras_gelu+keras_layernorm+autodiff_loss+autodiff_qkv+norm_per_gradient+dot_merger``: the step before these six
  (commit 961c978's).
- ``xla_layernorm``: ``TPU_PRETRAIN_LAYERNORM=xla``, XLA's compile of the package's one-pass norm on a GPU too, i.e.
  the package before its two Pallas (Triton) kernels (:mod:`tpu_pretrain.jax_backend.gpu_layer_norm`: a pass over
  the rows each way, the weights' gradients as partial sums), where the H100 measured XLA's norms at 7.4 ms of a 53 ms
  step. Measured on an H100 as a candidate, with XLA's Triton GEMMs still on: 1.016x (the kernels'); estimated under
  jax 0.11.2 for the package's step since: 40.1 (this) -> 38.4 ms, the residual copies gone too.
- ``two_sigmoids``: the tanh GELU's gradient as it was before 2026-11-28, its two sigmoids two exponentials and two
  divisions per element, where the package's takes one of each: on an H200 the kernel (the gradient with the
  feed-forward bias's) took 0.274 ms per block at 2.2 TB/s, half the card's copy rate (its arithmetic, by count).
  Predicted: up to -1 ms per step (2%); nothing if the kernel was bound by its bytes. A roofline cannot see it.
- ``eight_row_partials``: the Pallas norms' backward with a program per 8-row tile, as before 2026-11-28, where the
  package's loops over four: four times the partial sums of the weights' gradients to write and to add up (summing
  them took 0.59 ms of the H200's 43 ms step). Estimated for the H200 35.3 -> 35.0 ms (72.9 -> 72.0 GB); predicted
  -0.3 to -0.5 ms.
- ``full_last_block``: BERT's last block at every position, its output gathered at the loss's rows after, as before
  2026-11-28, where the package's computes that block's queries, output projection, feed-forward and norms at those
  rows only (``model.TransformerBlock.call_at_rows``; keys and values at every position): 5.5% of BERT-base's FLOPs
  at 128 with 20 predictions. Estimated for the H200: 35.0 -> 33.6 ms per step (the matrix products 27.6 -> 26.2,
  the rows' explicit attention and gather adding ~0.3 ms where cuDNN's block and the norms' and GELU's rows go).
- ``weight_casts``: no bfloat16 copies of the weights carried through a call's steps, as before 2026-11-28: each step's
  forward pass casts every weight it reads (162 small kernels per BERT-base step on a GPU), where the package's call
  casts them once and each step's update writes the new copies beside the weights (``step.with_copies``; on a GPU
  only). Estimated for the H200: 33.6 -> 33.3 ms (1,022 -> 886 kernels); the same weights, exactly.
- ``gemm_biases``: the attention-output and output layers' biases added by their GEMMs (cuBLASLt's epilogue), as
  before 2026-11-28, their gradients then XLA's reductions of the norms' input gradients (24 per BERT-base step,
  0.41 ms of the H200's 43); the package's GPU step adds them in the Pallas norms' forward kernels, whose backward
  sums their gradients in its pass (``model.TransformerBlock.residual_norm``; no dropout acting). Estimated for the
  H200: 33.3 -> 33.0 ms (887 -> 864 kernels).
- ``norm_sums_apart``: the global norm's large gradients each summed in a reduction of its own (two kernels each on
  a GPU: 144 for BERT-base's 72), as before 2026-11-28, where the package sums those of one shape in one variadic
  reduction (``step.sums_of_squares``: three kernels). Estimated for the H200: 33.0 -> 32.7 ms (864 -> 724 kernels).
- ``loss_passes_apart``: the MLM head's loss and accuracy reading the logits three times (the maximum with
  ``argmax``, the sum of exponentials, the label's logit), as before 2026-11-28, where the package's reads them once
  (``step.row_summary``: one variadic reduction, an online softmax). Estimated for the H200: 32.7 -> 32.5 ms.
- ``vocab_logits``: the MLM logits as wide as the vocabulary in a GPU's training step too, as before 2026-11-28:
  XLA pads the table for cuBLAS (30,522 -> 30,528 rows) and slices the logits, and the slice's gradient is a pad, a
  copy of the whole ``[predictions, vocabulary]`` gradient; the package's logits are padded to a multiple of 64
  columns (``lookups.tied_logits``; on an Ampere or newer GPU: a T4's schedule took 23 copies more with them).
  Estimated for the H200: 32.5 -> 32.4 ms (the pad's 0.16 ms).
- ``norm_partials_apart``: the Pallas norms' partial gradients (two or three per norm) each summed by a reduction of
  its own, as before 2026-11-28, where the package sums those of one norm in one variadic reduction
  (``gpu_layer_norm.summed_together``; the clipping norm's, ``step.sums_of_squares``, keeps its own binding and stays).
  Estimated for the H200: 32.4 -> 32.3 ms (48 kernels fewer). The query's and value's bias gradients summed together
  the same way: -0.04 ms on the H200, +1.1 ms on a T4 (its explicit attention's gradients then took a transpose each):
  not kept.
- ``while_graphs``: a candidate, not in the package: XLA's command buffers (CUDA graphs) taking the while loop and
  its conditionals too (``xla_gpu_enable_command_buffer`` with ``WHILE,CONDITIONAL`` beside XLA's defaults), so that a
  call of 20 steps is launched as one graph rather than ~650 kernels a step from the host (the H200's trace: 0.74 ms
  of 1-6 us gaps per 43 ms step, at 1,293 kernels). A compile cannot show it; the card measures it (``gpu_session.sh
  probe``).
- ``pallas_gelu``: a candidate, not in the package: the feed-forward GELU's gradient with its bias's as one Pallas
  (Triton) kernel on a GPU (``pallas_gelu.bias_gelu``: each program sums its columns over the rows it owns, in
  registers), for XLA's fusion of the two, the step's largest kernel that is not a product (0.274 ms per block on the
  H200, 2.2 TB/s); the forward is as before (cuBLASLt's epilogue). The roofline sees the same bytes and 12 small sums
  more; the card measures it (``gpu_session.sh probe``), alone too (``bench_kernels_gpu.py``).
- ``short_attention``: a candidate, not in the package: attention at length 128 by ``pallas_short_attention``'s two
  Pallas kernels (a program holds every key: the backward one kernel, the scores computed once, no helper kernels,
  the query's and value's bias gradients summed in its pass), for cuDNN's (0.377 ms per block on the H200: its
  backward, forward and 1.23 ms per step of helpers, against ~0.15 ms of bytes) and the 22 reductions of those biases'
  gradients (0.38 ms). The roofline cannot judge it (a Triton kernel's FLOPs are not in the HLO); the card measures it.
- ``norm_tiles``: the package's Pallas norms at the tiles of ``LAYER_NORM_TILES`` (rows per tile, tiles per backward
  program, warps), which ``gpu_session.sh probe`` sets to the shape fastest alone when it is not the package's: on
  the H200's trace the norms moved ~2.6 TB/s where the card copies at ~4.3 (2.5 ms per step).
- ``dynamic_loop``: every call loops to a count given as an array, as every call did before a GPU's full calls were
  compiled with their trip count (``JaxTrainer.full_calls_counted``): XLA's while loop then copies its condition to
  the host and waits for it after every step (0.48 ms of each 47 ms step on an H100's trace). A compile cannot show
  it (no kernel changes); the card measures it.
- ``xla_attention``: ``TPU_PRETRAIN_ATTENTION=xla`` (XLA's fused attention instead of cuDNN's flash kernels, which
  took 5.2 ms of the step at length 128): measured on an H100, 0.807x.
- ``splash_attention``: ``TPU_PRETRAIN_ATTENTION=splash``, the TPU's splash kernel at every length, as ``auto`` took
  it at 128 before 2026-11-28 (now from 256: :mod:`tpu_pretrain.jax_backend.splash`). For a TPU's compile
  (``--compile_for v5e-1 --steps 0 --batch 128``): the TPU compiler's cost model gives BERT-base's step 124.3 M
  cycles with it, the kernel's own not counted, against 127.3 M for ``base`` (XLA's attention): the kernel would have
  to take under 3.0 M (138.9 M and 22.0 M of copies with ``splash_length_major`` too; 146.6 M and 30.0 M with
  ``splash_head_minor`` as well). Off a TPU the kernel runs in Pallas's interpreter: not a variant to time on a GPU.
- ``splash_head_minor``: the splash kernel reading the queries, keys and values with the head size on the lanes
  (``splash.QKV_LAYOUT``), as before 2026-11-28, where the package puts the length there. For a TPU's compile at a
  length the kernel takes (``--compile_for v5e-1 --steps 0 --seq 512 --pred 76 --batch 32``).
- ``splash_length_major``: the projections around the splash kernel as XLA's path has them, ``[batch, length,
  hidden]`` products reshaped and transposed into the kernel's ``[batch, heads, length, head_size]`` and back, as
  before 2026-11-29, where the package projects into that order and out of it by einsums (``splash.HEADS_MAJOR``).
  For a TPU's compile at a length the kernel takes, as ``splash_head_minor``: BERT-base at 512, batch 32, v5e-1,
  125.4 M cycles for ``base`` against 140.3 M (copies 7.8 M against 22.1 M), the kernel's own not counted.
- ``value_bias_on_values``: on the splash kernel's path, BERT's value bias added to the values, as before 2026-11-29,
  where the package adds it after attention (``model.TransformerBlock.value_bias_after_attention``: ``b_o + b_v W_o``,
  exact since softmax's rows sum to 1), so its gradient is a ``[hidden]`` product, not a reduction of the kernel's
  value gradient (which the compiler cannot fuse into the kernel). For a TPU's compile at a length the kernel takes
  (``--compile_for v5e-1 --steps 0 --seq 512 --pred 76 --batch 32``): 125.4 M cycles against 118.9 for ``base``.
- ``by_heads_on_tpu``: a candidate, in the package but off (``model.TransformerBlock.projects_by_heads_on_tpu``): on
  a TPU off the splash kernel's path (XLA's attention: BERT at 128), the query, key and value projected in the
  kernel's order and their axes swapped back, so that the TPU compiler writes the keys and values with the length on
  the lanes, as its attention products read them, rather than copying them (two copies a block). The compiler's
  cycles (``--compile_for v5e-1 --steps 0 --batch 128``, BERT-base, libtpu 0.0.50.1), ``base`` against this: v5e-1
  at batch 128 127.3 against 124.6 M (copies 3.6 -> 0.4 M), at 64 57.6 against 58.9; v6e-1 at 128 68.8 against
  68.9; v5e-8 at 256 (32 a chip) 34.4 against 34.7. It pays only where the copies leave the chip's memory.
- ``bfloat16_bias_sums``: every bias's gradient summed by autodiff in bfloat16, as before 2026-11-29, where the package
  sums it in float32 (``lean_layers.add_bias``): XLA keeps a bfloat16 sum in bfloat16 on a Hopper GPU and on a CPU.
  Compiled for an H200: 32.3 ms either way (668 kernels, 67.2 GB). What a card measures here is whether the float32
  sums cost the GELU's gradient any time.
- ``bfloat16_table_sum``: the token table's gradient a scatter-add into bfloat16 (off a GPU), as before 2026-11-29,
  where the package scatters into float32 (``lookups.gathered_rows``): a bfloat16 scatter rounds a row after every
  update. For a v5e-1 at batch 128 (libtpu 0.0.50.1) 127.3 M cycles against 128.0 for the package's.
- ``pallas_attention``: a candidate, not in the package: JAX's own Pallas (Triton) flash attention on a GPU, padding
  and documents as its segment ids, where cuDNN's kernels ran at 89 TFLOP/s at length 128 (5.2 ms of the H100's
  53 ms step, 3.2 estimated). The roofline cannot judge it (a Triton kernel's FLOPs are not in the HLO); measured on
  an H100 at Pallas's default tiles, 0.949x; on an H200 at the tiles fastest alone (:data:`PALLAS_ATTENTION_TILES`),
  1.000x: cuDNN's stays.
- ``remat``: each block under ``jax.checkpoint``, saving only the GEMMs' outputs and the attention's (a policy):
  the LayerNorms and the GELU are recomputed inside the backward pass's fusions instead of their forward writing
  what the backward reads (:func:`kept_for_backward` on a CPU's attention path, BERT-base at 128, per token and
  block: ``keras_gelu`` 67.6 KiB, ``base`` 55.6, ``remat`` 15.0). Compiled, both compilers count the other way:
  recomputing reads the inputs again (the TPU's, ``--compile_for v5e-1 --steps 0 --batch 128``, libtpu 0.0.42.1,
  bytes accessed per step against ``keras_gelu``'s 72.5 GB: ``remat`` 87.7, +21%; the exact GELU's gradient 68.9,
  -5%; ``xla_attention`` 74.5 against the splash kernel's).
- ``exact_gelu``: the exact (erf) GELU for the tanh one the modern recipe builds (``hidden_act gelu_new``), i.e. the
  package before the recipe took it. With the tanh form's own gradient (``lean_layers.tanh_gelu``, keeping only its
  input) XLA's GEMM rewriter computes the bias and the GELU in cuBLASLt's epilogue (``BIAS_GELU_AUX``: the
  feed-forward GEMM writes the activation and its input) and no GELU kernel runs in the forward pass; it matches
  only the tanh form, and only where the tanh's intermediates are not kept (JAX's autodiff of it keeps them: the
  rewriter then folds the bias alone). Compiled for an H100 under jax 0.11.2: 40.4 ms (the package) against 42.2
  (this), the forward's GELU kernels' 1.8 ms; for a TPU v5e (batch 128) 65.6 GB accessed against 66.9, and 5.1 GiB
  of temporaries against 6.2; for a T4 (float16, no such epilogue) 0.993x. The loss differs from ``base`` by the two
  functions' difference (~1e-3 per activation).

Why a script of its own: a GPU session has minutes of device time; each change is tried here in one call against the
same baseline, and only what a measurement kept moves into the package. ``--compile_for``: each variant's step compiled
for a TPU (or the CPU) as ``tpu-pretrain plan`` compiles it, with the compiler's FLOPs, bytes accessed and temporaries
(:func:`compiled_counts`; ``--steps 0`` times nothing); or for a GPU (``h100``, ``h200``, ``a100``, ``l4``, ``t4``) by
JAX's CUDA plugin on this machine (:mod:`gpu_targets`), its time per step estimated from the GPU compiler's optimised
HLO (:mod:`hlo_roofline`, calibrated on the H100's trace: 52.8 ms estimated against 53.1 measured) and set against
``base``'s, part by part. BERT-base, batch 256, jax 0.10.2, estimated for an H100, each change entering the package in
turn: the step before them 48.1 ms; with the GELU's gradient 45.3 (1.061x), and the cross-entropy's 44.1, and the
one-pass LayerNorm 43.1, and the projections' gradient 42.5, and the joined norm 42.2 (1.140x in all; the dot merger
moves nothing there). Under jax 0.11.2, the H100's own compiler (a Python 3.12 environment): 49.8 -> 44.0 for the first
five, 42.2 with the dot merger off, 40.4 with the tanh GELU in the GEMMs' epilogue. Against the step before them
(0.10.2): ``remat`` 54.7 (0.880x: the recomputed LayerNorms and GELU cost 14.9 ms in the backward), ``xla_attention``
65.9 (0.729x).
``--smoke``: L2-H128 on the CPU, three variants, their steps compiled for the CPU too.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
import types
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("KERAS_BACKEND", "jax")

import gpu_targets  # noqa: E402
import tpu_cost_model  # noqa: E402
from bench_train_jax import SMOKE_STEP, add_step_arguments, step_config, warmed_trainer  # noqa: E402
from support import kernel_tiles, parse_args  # noqa: E402

from tpu_pretrain.config import Config  # noqa: E402
from tpu_pretrain.models.bert_config import (  # noqa: E402
    BERT_ACTIVATIONS,
    bert_config_for_size,
    training_flops_per_sequence,
)

CHANGES = ("base", "keras_gelu", "keras_layernorm", "autodiff_loss", "autodiff_qkv", "norm_per_gradient", "dot_merger",
           "triton_gemm", "xla_attention", "remat", "exact_gelu", "xla_layernorm", "dynamic_loop",
           "pallas_attention", "two_sigmoids", "eight_row_partials", "full_last_block", "weight_casts",
           "gemm_biases", "norm_sums_apart", "loss_passes_apart", "vocab_logits",
           "norm_partials_apart", "while_graphs", "pallas_gelu", "short_attention", "norm_tiles", "splash_attention",
           "splash_head_minor", "splash_length_major", "value_bias_on_values", "by_heads_on_tpu",
           "bfloat16_bias_sums", "bfloat16_table_sum")
# the step before these six entered the package (961c978's)
BEFORE = "keras_gelu+keras_layernorm+autodiff_loss+autodiff_qkv+norm_per_gradient+dot_merger"
VARIANTS = (*CHANGES, BEFORE)
# pallas_attention's tiles: the fastest of bench_attention_gpu.py's alone at length 128 on an H200 (2026-11-28)
PALLAS_ATTENTION_TILES = (128, 64, 64, 4, 3)


def variant(name: str) -> contextlib.ExitStack:
    """The package patched for ``name`` (changes joined by ``+``) while the trainer is built (its model is built and
    its step traced then)."""
    import jax
    import jax.numpy as jnp
    import keras

    from tpu_pretrain.jax_backend import devices, lean_layers, model, step

    changes, patches = name.split("+"), contextlib.ExitStack()
    exact = model.activation
    gelu = BERT_ACTIVATIONS
    if "keras_gelu" in changes:
        patches.enter_context(mock.patch.object(model, "activation", lambda act, for_gpu=False: (
            (lambda x: keras.activations.gelu(x, approximate=False)) if act in gelu else exact(act, for_gpu))))
    if "exact_gelu" in changes:
        patches.enter_context(mock.patch.object(model, "activation", lambda act, for_gpu=False: (
            exact("gelu" if act in gelu else act, for_gpu))))
    if "keras_layernorm" in changes:
        patches.enter_context(mock.patch.object(lean_layers.LayerNorm, "call", lambda self, inputs, mesh=None: (
            keras.layers.LayerNormalization.call(self, inputs))))
    if "autodiff_loss" in changes:
        def autodiff(logits, labels):
            log_p = jax.nn.log_softmax(logits.astype(jnp.float32))
            return -jnp.take_along_axis(log_p, labels[..., None], axis=-1)[..., 0]

        patches.enter_context(mock.patch.object(step.JaxOps, "loss_and_prediction", staticmethod(
            lambda logits, labels: (autodiff(logits, labels), jnp.argmax(logits, -1)))))
    if "autodiff_qkv" in changes:
        def projections(x, kernels, biases, for_gpu):
            return (*(jnp.matmul(x, kernel) + bias for kernel, bias in zip(kernels, biases, strict=True)), x)

        patches.enter_context(mock.patch.object(model, "shared_input_projections", projections))
    if "norm_per_gradient" in changes:
        patches.enter_context(mock.patch.object(step, "global_norm", lambda grads: jnp.sqrt(
            sum(jnp.sum(jnp.square(g.astype(jnp.float32))) for g in grads))))
    if "dynamic_loop" in changes:
        from tpu_pretrain.jax_backend.trainer import JaxTrainer

        def counting_none(self, *args, init=JaxTrainer.__init__, **kwargs):
            init(self, *args, **kwargs)
            self.full_calls_counted = False

        patches.enter_context(mock.patch.object(JaxTrainer, "__init__", counting_none))
    if "xla_layernorm" in changes:
        patches.enter_context(mock.patch.dict(os.environ, {"TPU_PRETRAIN_LAYERNORM": "xla"}))
    if "eight_row_partials" in changes:
        from tpu_pretrain.jax_backend import gpu_layer_norm

        patches.enter_context(mock.patch.object(gpu_layer_norm, "BACKWARD_TILES", 1))
    if "norm_tiles" in changes:  # the Pallas norms at LAYER_NORM_TILES (the fastest alone, where the probe sets it)
        from tpu_pretrain.jax_backend import gpu_layer_norm

        rows, tiles, warps = kernel_tiles("LAYER_NORM_TILES", (gpu_layer_norm.ROWS, gpu_layer_norm.BACKWARD_TILES,
                                                               gpu_layer_norm.WARPS))
        patches.enter_context(mock.patch.multiple(gpu_layer_norm, ROWS=rows, BACKWARD_TILES=tiles, WARPS=warps))
    if "loss_passes_apart" in changes:
        patches.enter_context(mock.patch.object(step.JaxOps, "loss_and_prediction", staticmethod(loss_passes_apart())))
    if "norm_sums_apart" in changes:  # the global norm's large gradients summed one reduction each
        patches.enter_context(mock.patch.object(step, "sums_of_squares", lambda arrays: [
            jnp.sum(jnp.square(a.astype(jnp.float32))) for a in arrays]))
    if "gemm_biases" in changes:  # every dense layer's bias in its GEMM, its gradient a reduction of its own
        patches.enter_context(mock.patch.object(model.TransformerBlock, "residual_norm", staticmethod(
            lambda x, dense, inputs, dropout, norm, training=False, mesh=None: norm(
                x + dropout(dense(inputs), training=training), mesh=mesh))))
    if "weight_casts" in changes:  # no copies carried: every step casts every weight it reads
        patches.enter_context(mock.patch.object(step, "read_dtypes", lambda apply, params, *rest: [None] * len(params)))
    if "norm_partials_apart" in changes:  # step.sums_of_squares keeps its own binding of summed_together
        from tpu_pretrain.jax_backend import gpu_layer_norm

        patches.enter_context(mock.patch.object(gpu_layer_norm, "summed_together", lambda arrays, axes: [
            jnp.sum(a.astype(jnp.float32), axis=tuple(axes)) for a in arrays]))
    if "vocab_logits" in changes:
        tied = model.tied_logits
        patches.enter_context(mock.patch.object(model, "tied_logits", lambda x, table, bias=None, padded=False: tied(
            x, table, bias)))
    if "full_last_block" in changes:
        patches.enter_context(mock.patch.object(model.PretrainingBert, "last_block_at_rows", False))
    if "two_sigmoids" in changes:
        patches.enter_context(mock.patch.object(model, "tanh_gelu", two_sigmoids_gelu(lean_layers.tanh_gelu)))
    if "while_graphs" in changes:
        patches.enter_context(mock.patch.dict(devices.GPU_COMPILER_OPTIONS, {
            "xla_gpu_enable_command_buffer": "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL"}))
    for change, option in (("dot_merger", "xla_gpu_dot_merger_threshold_mb"),
                           ("triton_gemm", "xla_gpu_enable_triton_gemm")):
        if change in changes:  # XLA's default again: the package's option left out
            patches.enter_context(mock.patch.object(devices, "GPU_COMPILER_OPTIONS", {
                key: value for key, value in devices.GPU_COMPILER_OPTIONS.items() if key != option}))
    if "pallas_attention" in changes:
        patches.enter_context(mock.patch.object(model, "masked_attention", pallas_attention(model.masked_attention)))
    if "short_attention" in changes:
        block = model.TransformerBlock
        patches.enter_context(mock.patch.object(block, "context", short_attention_context(block.context)))
    if "pallas_gelu" in changes:
        block = model.TransformerBlock
        patches.enter_context(mock.patch.object(block, "hidden", pallas_gelu_hidden(block.hidden)))
    if "xla_attention" in changes:
        patches.enter_context(mock.patch.dict(os.environ, {"TPU_PRETRAIN_ATTENTION": "xla"}))
    if "splash_attention" in changes:
        patches.enter_context(mock.patch.dict(os.environ, {"TPU_PRETRAIN_ATTENTION": "splash"}))
    if "splash_head_minor" in changes:
        from tpu_pretrain.jax_backend import splash

        patches.enter_context(mock.patch.object(splash, "QKV_LAYOUT", splash.kernels.QKVLayout.HEAD_DIM_MINOR))
        splash.kernel.cache_clear()
        patches.callback(splash.kernel.cache_clear)
    if "splash_length_major" in changes:
        from tpu_pretrain.jax_backend import splash

        patches.enter_context(mock.patch.object(splash, "HEADS_MAJOR", False))
    if "value_bias_on_values" in changes:
        patches.enter_context(mock.patch.object(model.TransformerBlock, "value_bias_moves", False))
    if "by_heads_on_tpu" in changes:
        patches.enter_context(mock.patch.object(model.TransformerBlock, "projects_by_heads_on_tpu", True))
    if "bfloat16_bias_sums" in changes:
        patches.enter_context(mock.patch.object(lean_layers, "_float32_summed_bias", lambda x, bias, for_gpu: x + bias))
    if "bfloat16_table_sum" in changes:
        from tpu_pretrain.jax_backend import lookups

        patches.enter_context(mock.patch.object(lookups, "_gathered_rows", lambda table, ids, dtype: jnp.take(
            table.astype(dtype), ids, axis=0)))
    if "remat" in changes:
        block = model.TransformerBlock
        patches.enter_context(mock.patch.object(block, "call", remat_call(block.call)))
    return patches


def pallas_attention(masked, interpret: bool = False):
    """``masked_attention`` by JAX's Pallas (Triton) flash attention (``pallas.ops.gpu.attention.mha``; padding and
    documents as its segment ids) on a GPU or with ``interpret``, else ``masked`` (``pallas_attention``), at
    :data:`PALLAS_ATTENTION_TILES`."""
    from bench_attention_gpu import pallas_call

    from tpu_pretrain.jax_backend.devices import target_platform
    from tpu_pretrain.jax_backend.documents import document_ids

    kernel = pallas_call(PALLAS_ATTENTION_TILES, interpret)

    def call(q, k, v, attend, documents=None, window=None, path="auto", mesh=None):
        if window is not None or not (interpret or target_platform(mesh) == "gpu"):
            return masked(q, k, v, attend, documents, window, path, mesh)
        return kernel(q, k, v, attend, document_ids(None, attend, None) if documents is None else documents)

    return call


def short_attention_context(context, interpret: bool = False):
    """``TransformerBlock.context`` with attention by ``pallas_short_attention``'s kernels where they take the shapes,
    the query's and value's biases added and their gradients summed inside them (the projections' GEMMs then add
    none), on a GPU or with ``interpret`` (``short_attention``), else ``context``."""
    import pallas_short_attention
    from keras import ops

    from tpu_pretrain.jax_backend.devices import target_platform
    from tpu_pretrain.jax_backend.model import shared_input_projections

    def call(self, x, attend, documents=None, training=False, mesh=None):
        batch, length, width = x.shape
        shape = (batch, length, self.heads, width // self.heads)
        if (self.explicit(training) or not pallas_short_attention.applies(shape)
                or not (interpret or target_platform(mesh) == "gpu")):
            return context(self, x, attend, documents, training, mesh)
        kernels = tuple(ops.cast(p.kernel, x.dtype) for p in (self.query, self.key, self.value))
        q, k, v, x = shared_input_projections(x, kernels, None, target_platform(mesh) == "gpu")
        q_bias, v_bias = (ops.reshape(ops.cast(p.bias, x.dtype), shape[2:]) for p in (self.query, self.value))
        out = pallas_short_attention.attention(*(ops.reshape(t, shape) for t in (q, k, v)), q_bias, v_bias,
                                               *pallas_short_attention.ids(attend, documents), interpret)
        return ops.reshape(out, x.shape), x

    return call


def pallas_gelu_hidden(hidden, interpret: bool = False):
    """``TransformerBlock.hidden`` with the tanh GELU's gradient and its bias's by ``pallas_gelu``'s kernel on a GPU
    or with ``interpret`` (``pallas_gelu``), else ``hidden``."""
    from keras import ops
    from pallas_gelu import bias_gelu

    from tpu_pretrain.jax_backend.devices import target_platform
    from tpu_pretrain.models.bert_config import TANH_GELU_NAMES

    def call(self, x, mesh=None):
        if self.hidden_act not in TANH_GELU_NAMES or not (interpret or target_platform(mesh) == "gpu"):
            return hidden(self, x, mesh)
        dense = self.intermediate
        return bias_gelu(ops.matmul(x, ops.cast(dense.kernel, x.dtype)), ops.cast(dense.bias, x.dtype), interpret)

    return call


def loss_passes_apart():
    """The MLM head's loss and prediction as before 2026-11-28 (``loss_passes_apart``): the log-sum-exp (the maximum,
    then the sum of exponentials), the label's logit and ``argmax`` each a pass over the logits; the same gradient."""
    import jax
    import jax.numpy as jnp

    from tpu_pretrain.jax_backend import step

    @jax.custom_vjp
    def loss(logits, labels):
        return forward(logits, labels)[0]

    def forward(logits, labels):
        x = logits.astype(jnp.float32)
        total = jax.nn.logsumexp(x, axis=-1)
        return total - jnp.take_along_axis(x, labels[..., None], axis=-1)[..., 0], (logits, labels, total)

    loss.defvjp(forward, lambda saved, grad: step._loss_and_prediction_backward(saved, (grad, None)))
    return lambda logits, labels: (loss(logits, labels), jnp.argmax(logits, -1))


def two_sigmoids_gelu(tanh_gelu):
    """``tanh_gelu`` with the gradient it had before 2026-11-28: its two sigmoids each an exponential and a division
    (``two_sigmoids``), the forward unchanged (cuBLASLt's epilogue on a GPU)."""
    import functools

    import jax
    import jax.numpy as jnp

    from tpu_pretrain.jax_backend.lean_layers import _TANH_CUBIC, _TANH_SCALE

    @functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
    def gelu(x, for_gpu):
        return tanh_gelu(x, for_gpu)

    def backward(for_gpu, x, grad):
        x32 = x.astype(jnp.float32)
        twice = 2 * _TANH_SCALE * (x32 + _TANH_CUBIC * x32 * x32 * x32)
        cdf = jax.nn.sigmoid(twice)
        slope = cdf + 2 * x32 * cdf * jax.nn.sigmoid(-twice) * _TANH_SCALE * (1.0 + 3 * _TANH_CUBIC * x32 * x32)
        return ((grad.astype(jnp.float32) * slope).astype(x.dtype),)

    gelu.defvjp(lambda x, for_gpu: (gelu(x, for_gpu), x), backward)
    return gelu


def remat_call(call):
    """``TransformerBlock.call`` under ``jax.checkpoint``: what the backward pass needs is recomputed from the
    GEMMs' and the attention's outputs (``remat``; without dropout, whose key the checkpoint would have to carry)."""
    import jax

    dots = jax.checkpoint_policies.dots_with_no_batch_dims_saveable

    def saved(primitive, *args, **params):
        # cuDNN's attention ("dot_product_attention_fwd") and the splash kernel (a Pallas call) are kept, not re-run
        return "attention" in primitive.name or primitive.name == "pallas_call" or dots(primitive, *args, **params)

    def remat(self, x, attend, documents=None, training=False, mesh=None, rows=None):
        return jax.checkpoint(lambda h: call(self, h, attend, documents, training, mesh, rows), policy=saved)(x)

    return remat


def kept_for_backward(name: str, model_size: str, vocab: int, seq: int) -> float:
    """Bytes per token that one block's forward keeps for its backward under ``name``, in mixed bfloat16 on this
    machine's attention path: the residuals of ``jax.vjp`` as shapes (nothing computed), at one sequence and at
    two, whose difference is what scales with the tokens (the weights' bfloat16 copies cancel). What XLA then writes
    to memory can be less (a cheap producer fused into the backward) but the forward cannot write less than this
    asks of it; a figure that runs on a CPU, for a variant before a GPU's minutes go to it."""
    import jax
    import jax.numpy as jnp

    from tpu_pretrain.jax_backend import attention, model

    config = bert_config_for_size(model_size, vocab)
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    with variant(name):
        block = model.TransformerBlock(config, model._Factory(config, "mixed_bfloat16"), attention.attention_path())
        block(jnp.zeros((1, seq, config.hidden_size), jnp.bfloat16), jnp.ones((1, seq), bool))  # its weights
        weights = [v.value for v in block.trainable_variables]

        def kept(rows: int) -> int:
            x, attend = jnp.zeros((rows, seq, config.hidden_size), jnp.bfloat16), jnp.ones((rows, seq), bool)
            residuals = jax.eval_shape(lambda w, x: jax.vjp(
                lambda w, x: block.stateless_call(w, [], x, attend, training=True)[0], w, x)[1], weights, x)
            return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree_util.tree_leaves(residuals))

        return (kept(2) - kept(1)) / seq


def built(name: str, config: Config) -> dict:
    """``name``'s JAX trainer built and its step compiled under its patches (:func:`bench_train_jax.warmed_trainer`),
    ready to be timed in turns with the others'."""
    with variant(name):
        trainer, first = warmed_trainer(config)
    return {"trainer": trainer, "first": first, "seconds": [], "losses": []}


def timed_in_turns(variants: dict, config: Config, steps: int, rounds: int) -> dict:
    """Each built variant's ``steps`` timed in ``rounds`` turns, every variant a turn per round (the order rotated each
    round): a card's clock or temperature drifting over the minutes falls on all of them alike, and each round gives
    each variant's ratio to ``base`` measured side by side. Sequences/s over all its turns (``rate``), each round's
    (``rates``), the mean loss of its timed steps (the same batches for all)."""
    per_turn = steps // rounds
    names = list(variants)

    def turn(name: str) -> tuple[float, dict]:
        with variant(name):  # a call that traced again would still be this variant's
            start = time.perf_counter()
            metrics = variants[name]["trainer"].train_steps(per_turn)
            return time.perf_counter() - start, metrics

    for r in range(-1, rounds):  # round -1 untimed: every trainer's input read ahead, none still filling its queue
        for name in names[r % len(names):] + names[:r % len(names)]:
            if name not in variants:
                continue
            timed = attempted(name, f"its turn in round {r + 1}", turn, name)
            if timed is None:  # a variant that fails a turn leaves the rounds; the others' go on
                variants.pop(name)["trainer"].close()
            elif r >= 0:
                variants[name]["seconds"].append(timed[0])
                variants[name]["losses"].append(float(timed[1]["loss"]))
    batch = config.train.train_batch_size
    for v in variants.values():
        v["trainer"].close()
        v.update(rate=per_turn * batch * rounds / sum(v["seconds"]), rates=[per_turn * batch / s for s in v["seconds"]],
                 loss=sum(v["losses"]) / rounds)
    return variants


def against_base(results: dict) -> None:
    """Each variant's rate against ``base``'s, round by round: the median of the rounds' ratios and their range."""
    base = results.get("base")
    if not base:
        return
    for name, r in results.items():
        ratios = [a / b for a, b in zip(r["rates"], base["rates"], strict=True)]
        print(f"{name:28} {statistics.median(ratios):.3f}x base (rounds {min(ratios):.3f}-{max(ratios):.3f}); loss "
              f"{r['loss'] - base['loss']:+.2e} from base", flush=True)


def trainer_for(config: Config, devices):
    """The JAX trainer of ``config``'s run compiled for ``devices`` (the variant's patches in place meanwhile)."""
    from tpu_pretrain.core.resolve import RunPlan
    from tpu_pretrain.jax_backend.trainer import JaxTrainer

    run_plan = RunPlan.from_settings(config)
    return JaxTrainer(run_plan.config, devices=devices, plan=run_plan)


def gpu_estimate(name: str, config: Config, target: str) -> dict:
    """One step of ``name`` compiled for the GPU ``target`` on this machine (:mod:`gpu_targets`) and costed from the
    GPU compiler's optimised HLO by :mod:`hlo_roofline`: milliseconds per step estimated, kernels, bytes moved."""
    import hlo_roofline

    from tpu_pretrain.jax_backend.plan import lower_step

    with variant(name), gpu_targets.compiling_for(target) as devices:
        trainer = trainer_for(config, devices)
        t = trainer.config.train
        trainer.set_batch(t.train_batch_size, t.gradient_accumulation_steps)
        with gpu_targets.lowering_for(devices):
            compiled = lower_step(trainer).compile()
        trainer.close()
    found = hlo_roofline.kernels(compiled.as_text())
    return {**hlo_roofline.estimate(found, hlo_roofline.CARDS[target]),
            "temporaries_gib": compiled.memory_analysis().temp_size_in_bytes / 2**30}


def compiled_counts(name: str, config: Config, target: str):
    """One step of ``name`` compiled for ``target`` by ``tpu-pretrain plan``'s own compile (a TPU by name, with the
    TPU compiler and no TPU; or ``cpu``): ``(its StepCompile, its cycles)``: the compiler's FLOPs and bytes accessed
    (its cost model's count over the optimised HLO) and the temporaries; the cycles its cost model gives the step
    (:func:`tpu_cost_model.step_cycles`; None off a TPU's compile)."""
    from tpu_pretrain.jax_backend import plan

    texts, lower_step = [], plan.lower_step

    def lowered_and_kept(trainer):  # the plan's own lowering; its compiled text kept for the cost model
        lowered = lower_step(trainer)
        return types.SimpleNamespace(compile=lambda: _kept(lowered.compile(), texts))

    with variant(name), mock.patch.object(plan, "lower_step", lowered_and_kept):
        tpu = plan.check_request(target)
        devices = plan.devices_for(target, tpu)
        trainer = trainer_for(config, devices)
        t = trainer.config.train
        compiled = plan.compile_step(trainer, t.train_batch_size, t.gradient_accumulation_steps,
                                     plan.capacity_of(devices, tpu))
        trainer.close()
    return compiled, tpu_cost_model.step_cycles(texts[-1]) if tpu and texts else None


def _kept(compiled, texts: list):
    texts.append(compiled.as_text())
    return compiled


def show_estimates(estimates: dict, target: str, batch: int) -> None:
    """Each variant's estimated step on ``target``, then against ``base`` where it was estimated too: the step and
    the parts of the model whose non-matmul time moved most."""
    for name, e in estimates.items():
        print(f"{name:28} compiled for {target} (estimated from its HLO): {e['ms']:.1f} ms per step, "
              f"{batch / e['ms'] * 1e3:,.0f} sequences/s ({e['matmul_ms']:.1f} ms in matrix products, "
              f"{e['other_ms']:.1f} elsewhere); {e['kernels']} kernels, {e['gb_moved']:.1f} GB moved, temporaries "
              f"{e['temporaries_gib']:.2f} GiB", flush=True)
        print("    outside the matrix products (ms): " + ", ".join(
            f"{part} {ms:.2f}" for part, ms in list(e["other_by_part"].items())[:8]))
    base = estimates.get("base")
    for name, e in estimates.items() if base else ():
        if name != "base":
            parts = {p: e["other_by_part"].get(p, 0.0) - base["other_by_part"].get(p, 0.0)
                     for p in {*e["other_by_part"], *base["other_by_part"]}}
            moved = ", ".join(f"{p} {ms:+.2f}" for p, ms in sorted(parts.items(), key=lambda kv: -abs(kv[1]))[:4])
            print(f"{name:28} {base['ms'] / e['ms']:.3f}x base estimated on {target}; ms moved: {moved}")


def show_cycles(cycles: dict) -> None:
    """Each variant's step against ``base``'s by the TPU compiler's cycles, and the parts that moved most."""
    base = cycles.get("base")
    for name, c in cycles.items() if base else ():
        if name != "base":
            moved = {p: c["by_part"].get(p, 0) - base["by_part"].get(p, 0) for p in {*c["by_part"], *base["by_part"]}}
            parts = ", ".join(f"{p} {m / 1e6:+.1f}" for p, m in sorted(moved.items(), key=lambda kv: -abs(kv[1]))[:4])
            print(f"{name:28} {base['cycles'] / c['cycles']:.3f}x base by the compiler's cycles (Pallas kernels "
                  f"{c['unseen_kernels']} against {base['unseen_kernels']}, not costed); M cycles moved: {parts}")


def attempted(name: str, what: str, run, *args):
    """``run(*args)``, or None with the error said: a variant that fails (a kernel this JAX lowers otherwise) costs a
    device session its own figures only, not the others'."""
    try:
        return run(*args)
    except Exception as exc:  # any failure of one variant: the others still run
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(f"{name:28} {what} failed: {type(exc).__name__}: {first}", flush=True)
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS),
                        help=f"changes, or changes joined by + (default: all of {', '.join(VARIANTS)})")
    parser.add_argument("--xla_flags", default="", help="added to XLA_FLAGS for every variant of this process")
    parser.add_argument("--compile_for", default="", help="also compile each variant's step for this target and "
                        "print the compiler's counts: a TPU (v5e-1, v5e-8...; the TPU compiler, pip install "
                        "'jax[tpu]', no TPU needed), cpu, or a GPU (h100, h200, a100, l4, t4: JAX's CUDA plugin, no "
                        "GPU needed; the step's time estimated from its optimised HLO); --steps 0 times nothing")
    add_step_arguments(parser, batch=256, steps=40, steps_per_execution=20)
    parser.add_argument("--rounds", type=int, default=2, help="the timed steps in this many turns per variant, the "
                        "variants taking turns (a multiple of --steps_per_execution per turn keeps every call full)")
    args = parse_args(parser, smoke={**SMOKE_STEP, "steps_per_execution": 2, "compile_for": "cpu", "steps": 4,
                                     "variants": ["keras_gelu", "remat", "exact_gelu"]},
                      what="L2-H128, vocab 1000, batch 4 x 32 tokens, 4 timed steps in two rounds; three variants, "
                           "their steps compiled for the CPU too")
    on_gpu = args.compile_for in gpu_targets.TARGETS
    if on_gpu:
        gpu_targets.prepare(args.compile_for)
        try:  # before anything is computed: the plugin is there, or the message says how to install it
            gpu_targets.described(args.compile_for)
        except RuntimeError as exc:
            parser.exit(2, f"bench_step_variants.py: {exc}\n")
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: at least 1")
    if args.steps and (args.steps % args.rounds or args.steps // args.rounds % args.steps_per_execution):
        parser.error(f"--steps {args.steps} in --rounds {args.rounds}: each turn a multiple of --steps_per_execution "
                     f"{args.steps_per_execution} (a shorter call runs another executable, compiled on its first use)")
    unknown = sorted({c for name in args.variants for c in name.split("+")} - set(CHANGES))
    if unknown:
        parser.error(f"no such change: {', '.join(unknown)} (these are: {', '.join(CHANGES)})")
    if args.xla_flags:  # read when JAX starts its backend: before the first trainer is built
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {args.xla_flags}".strip()
        print(f"XLA_FLAGS={os.environ['XLA_FLAGS']}")
    flops = training_flops_per_sequence(bert_config_for_size(args.model_size, args.vocab), args.seq, args.pred)
    for name in args.variants:
        kept = attempted(name, "its block", kept_for_backward, name, args.model_size, args.vocab, args.seq)
        if kept is not None:
            print(f"{name:28} one block keeps {kept / 1024:.1f} KiB per token for its backward ({args.model_size}, "
                  f"length {args.seq})", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        config = step_config(folder, args, hidden_dropout_prob=0.0)
        estimates = {name: attempted(name, "its estimate", gpu_estimate, name, config, args.compile_for)
                     for name in args.variants if on_gpu}
        show_estimates({name: e for name, e in estimates.items() if e is not None}, args.compile_for, args.batch)
        cycles = {}
        for name in args.variants if args.compile_for and not on_gpu else ():
            counted = attempted(name, "its compile", compiled_counts, name, config, args.compile_for)
            if counted is None:
                continue
            c, cycles[name] = counted
            said = f"did not compile: {c.error}" if c.error else (
                f"{c.flops / 1e12:.3f} TFLOP, {c.bytes_accessed / 1e9:.2f} GB accessed (the compiler's count), "
                f"temporaries {c.memory['temporaries'] / 2**30:.2f} GiB")
            if cycles[name]:
                said += (f"; {cycles[name]['cycles'] / 1e6:.1f} M cycles by its cost model (copies "
                         f"{cycles[name]['by_op'].get('copy', 0) / 1e6:.1f} M; {cycles[name]['unseen_kernels']} "
                         "Pallas kernels it does not cost)")
            print(f"{name:28} compiled for {args.compile_for}, one step: {said}", flush=True)
        show_cycles({name: c for name, c in cycles.items() if c})
        ready = {name: attempted(name, "its build", built, name, config) for name in args.variants if args.steps}
        ready = {name: v for name, v in ready.items() if v is not None}
        results = timed_in_turns(ready, config, args.steps, args.rounds) if ready else {}
    for name, r in results.items():
        spread = (max(r["rates"]) - min(r["rates"])) / r["rate"]
        print(f"{name:28} {r['rate']:10.1f} sequences/s ({r['rate'] * flops / 1e12:.2f} TFLOP/s; rounds within "
              f"{spread:.1%}); first call {r['first']:.1f} s; loss {r['loss']:.5f}", flush=True)
    against_base(results)


if __name__ == "__main__":
    main()
