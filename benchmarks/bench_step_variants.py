"""Variants of the JAX training step timed side by side in one process: changes tried before they enter the package.

Usage: PYTHONPATH=KERAS_WHEELS python benchmarks/bench_step_variants.py [--variants base gelu_grad remat ...]
           [--xla_flags FLAGS] [--compile_for v5e-1|cpu] [--model_size L12-H768] [--batch 256] [--steps 40]
           [--smoke]

Each variant builds the JAX trainer as ``bench_train_jax.py`` does (random data, 20 steps per call) with one change
made from here (the package is patched in this process only), and prints sequences/s, the first call (the
compile) and the loss after the timed steps, which must agree with ``base`` to bfloat16's precision; before the
timing, what one block's forward keeps for its backward under each (:func:`kept_for_backward`, bytes per token):

- ``base``: the package as it is.
- ``gelu_grad``: the feed-forward layer's bias and exact GELU through a ``jax.custom_vjp`` that keeps only the
  GEMM's output for the gradient and casts the gradient to the compute dtype before the bias gradient's sum (so
  XLA can produce both in one pass). Measured on an H100 (benchmarks/GPU_NOTES.md), the GELU's two passes took
  8.2 ms of a 53 ms step; a first version with the gradient in float32 moved it by -1% (its backward wrote float32).
- ``xla_attention``: ``TPU_PRETRAIN_ATTENTION=xla`` (XLA's fused attention instead of cuDNN's flash kernels, which
  took 5.2 ms of the step at length 128).
- ``gelu_grad+xla_attention``: both.
- ``remat``: each block under ``jax.checkpoint``, saving only the GEMMs' outputs and the attention's (a policy):
  the LayerNorms and the GELU are recomputed inside the backward pass's fusions instead of their forward writing
  what the backward reads (per token and block, three float32 copies of the LayerNorms' ``[768]`` inputs and four
  bfloat16 ``[3072]`` tensors of the GELU: ``jax.ad_checkpoint.print_saved_residuals`` on one block; by
  :func:`kept_for_backward` on a CPU's attention path, BERT-base at 128: 67.6 KiB per token and block for ``base``,
  15.0 for ``remat``, 55.6 for ``gelu_grad``, 79.6 for ``tanh_gelu``). The TPU compiler counts the other way
  (``--compile_for v5e-1 --steps 0 --batch 128``, libtpu 0.0.42.1: bytes accessed per step, base 72.5 GB, ``remat``
  87.7, +21%, its temporaries 6.2 -> 5.2 GiB; ``gelu_grad`` 68.9, -5%; ``tanh_gelu`` 67.5, -7%, temporaries 5.1 GiB;
  ``xla_attention`` 74.5 against the splash kernel's): recomputing reads the inputs again. Predicted on a GPU
  +3-8% (the GELU's forward 4.1 -> ~1.7 ms as under its ``custom_vjp``, the LayerNorms' forward writes halved), unless
  the recomputed row statistics cost the backward what the forward saved.
- ``tanh_gelu``: the tanh GELU (``gelu_new``) for BERT's exact one: alone ~0 (both memory-bound). With
  ``--xla_flags=--xla_gpu_enable_cublaslt=true`` (another process: XLA reads its flags when JAX starts) XLA's GEMM
  rewriter may fold the bias and the tanh GELU into cuBLASLt's epilogue (the forward's GELU kernel gone, its input
  kept as the GEMM's auxiliary output); its pattern checks the constants closely, which bfloat16's may miss: the
  profile says which (a ``cublas-lt-matmul`` where the GELU's fusion was). The loss differs from ``base`` by the
  two functions' difference (~1e-3 per activation).

Why a script of its own: a GPU session has minutes of device time; each change is tried here in one call against
the same baseline, and only what a measurement kept moves into the package. ``--compile_for``: each variant's step
compiled for a TPU (or the CPU) as ``tpu-pretrain plan`` compiles it, with the compiler's FLOPs, bytes accessed and
temporaries (:func:`compiled_counts`; ``--steps 0`` times nothing). ``--smoke``: L2-H128 on the CPU, three variants,
their steps compiled for the CPU too.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("KERAS_BACKEND", "jax")

from bench_train_jax import SMOKE_STEP, add_step_arguments, step_config, time_training  # noqa: E402
from support import parse_args  # noqa: E402

from tpu_pretrain.config import Config  # noqa: E402
from tpu_pretrain.models.bert_config import bert_config_for_size, training_flops_per_sequence  # noqa: E402

VARIANTS = ("base", "gelu_grad", "xla_attention", "gelu_grad+xla_attention", "remat", "tanh_gelu")


def gelu_dense_class():
    """A ``keras.layers.Dense`` with the exact GELU whose gradient keeps only the GEMM's output (``gelu_grad``)."""
    import math

    import jax
    import jax.numpy as jnp
    import keras
    from keras import ops

    @jax.custom_vjp
    def bias_gelu(y, bias):
        return jax.nn.gelu(y + bias, approximate=False)

    def forward(y, bias):
        return bias_gelu(y, bias), (y, bias)

    def backward(saved, grad):
        y, bias = saved
        h = y.astype(jnp.float32) + bias.astype(jnp.float32)
        slope = 0.5 * (1.0 + jax.lax.erf(h * math.sqrt(0.5))) + h * jnp.exp(-0.5 * h * h) / math.sqrt(2 * math.pi)
        dh = (grad.astype(jnp.float32) * slope).astype(y.dtype)  # one tensor in the compute dtype, two consumers
        return dh, jnp.sum(dh, axis=tuple(range(y.ndim - 1)), dtype=jnp.float32).astype(bias.dtype)

    bias_gelu.defvjp(forward, backward)

    class GeluDense(keras.layers.Dense):
        def call(self, inputs, training=None):
            y = ops.matmul(inputs, ops.cast(self.kernel, self.compute_dtype))
            return bias_gelu(y, ops.cast(self.bias, self.compute_dtype))

    return GeluDense


def variant(name: str) -> contextlib.ExitStack:
    """The package patched for ``name`` while the trainer is built (its model is built then): the blocks'
    feed-forward layer (``intermediate``, exact GELU in every BERT size) and the attention path."""
    from tpu_pretrain.jax_backend import model

    patches = contextlib.ExitStack()
    if "gelu_grad" in name:
        gelu_dense, original = gelu_dense_class(), model._Factory.dense

        def dense(self, units, layer_name, activation=None):
            if layer_name == "intermediate":
                return gelu_dense(units, kernel_initializer=self.init(), name=layer_name, dtype=self.dtype)
            return original(self, units, layer_name, activation)

        patches.enter_context(mock.patch.object(model._Factory, "dense", dense))
    if "xla_attention" in name:
        patches.enter_context(mock.patch.dict(os.environ, {"TPU_PRETRAIN_ATTENTION": "xla"}))
    if name == "remat":
        block = model.TransformerBlock
        patches.enter_context(mock.patch.object(block, "call", remat_call(block.call)))
    if name == "tanh_gelu":
        exact = model.activation
        patches.enter_context(mock.patch.object(model, "activation",
                                                lambda act: exact("gelu_new" if act == "gelu" else act)))
    return patches


def remat_call(call):
    """``TransformerBlock.call`` under ``jax.checkpoint``: what the backward pass needs is recomputed from the
    GEMMs' and the attention's outputs (``remat``; without dropout, whose key the checkpoint would have to carry)."""
    import jax

    dots = jax.checkpoint_policies.dots_with_no_batch_dims_saveable

    def saved(primitive, *args, **params):
        # cuDNN's attention ("dot_product_attention_fwd") and the splash kernel (a Pallas call) are kept, not re-run
        return "attention" in primitive.name or primitive.name == "pallas_call" or dots(primitive, *args, **params)

    def remat(self, x, attend, documents=None, training=False, mesh=None):
        return jax.checkpoint(lambda h: call(self, h, attend, documents, training, mesh), policy=saved)(x)

    return remat


def kept_for_backward(name: str, model_size: str, vocab: int, seq: int) -> float:
    """Bytes per token that one block's forward keeps for its backward under ``name``, in mixed bfloat16 on this
    machine's attention path: the residuals of ``jax.vjp`` as shapes (nothing computed), at one sequence and at
    two, whose difference is what scales with the tokens (the weights' bfloat16 copies cancel). What XLA then writes
    to memory can be less (a cheap producer fused into the backward) but the forward cannot write less than this
    asks of it; a figure that runs on a CPU, for a variant before a GPU's minutes go to it."""
    import jax
    import jax.numpy as jnp

    from tpu_pretrain.jax_backend import model

    config = bert_config_for_size(model_size, vocab)
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    with variant(name):
        block = model.TransformerBlock(config, model._Factory(config, "mixed_bfloat16"), model.attention_path())
        block(jnp.zeros((1, seq, config.hidden_size), jnp.bfloat16), jnp.ones((1, seq), bool))  # its weights
        weights = [v.value for v in block.trainable_variables]

        def kept(rows: int) -> int:
            x, attend = jnp.zeros((rows, seq, config.hidden_size), jnp.bfloat16), jnp.ones((rows, seq), bool)
            residuals = jax.eval_shape(lambda w, x: jax.vjp(
                lambda w, x: block.stateless_call(w, [], x, attend, training=True)[0], w, x)[1], weights, x)
            return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree_util.tree_leaves(residuals))

        return (kept(2) - kept(1)) / seq


def time_variant(name: str, config: Config, steps: int) -> dict:
    """``bench_train_jax.time_training`` with the package patched for ``name`` (its model is built at the start)."""
    with variant(name):
        return time_training(config, steps)


def compiled_counts(name: str, config: Config, target: str):
    """One step of ``name`` compiled for ``target`` by ``tpu-pretrain plan``'s own compile (a TPU by name, with the
    TPU compiler and no TPU; or ``cpu``): its :class:`StepCompile`, with the compiler's FLOPs and bytes accessed (its
    cost model's count over the optimised HLO) and the temporaries."""
    from tpu_pretrain.core.resolve import RunPlan
    from tpu_pretrain.jax_backend.plan import capacity_of, check_request, compile_step, devices_for
    from tpu_pretrain.jax_backend.trainer import JaxTrainer

    with variant(name):
        run_plan, tpu = RunPlan.from_settings(config), check_request(target)
        devices = devices_for(target, tpu)
        trainer = JaxTrainer(run_plan.config, devices=devices, plan=run_plan)
        t = trainer.config.train
        compiled = compile_step(trainer, t.train_batch_size, t.gradient_accumulation_steps, capacity_of(devices, tpu))
        trainer.close()
    return compiled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--xla_flags", default="", help="added to XLA_FLAGS for every variant of this process")
    parser.add_argument("--compile_for", default="", help="also compile each variant's step for this target and "
                        "print the compiler's counts: a TPU (v5e-1, v5e-8...; the TPU compiler, pip install "
                        "'jax[tpu]', no TPU needed) or cpu; --steps 0 times nothing")
    add_step_arguments(parser, batch=256, steps=40, steps_per_execution=20)
    args = parse_args(parser, smoke={**SMOKE_STEP, "steps_per_execution": 2, "compile_for": "cpu",
                                     "variants": ["gelu_grad+xla_attention", "remat", "tanh_gelu"]},
                      what="L2-H128, vocab 1000, batch 4 x 32 tokens, 2 timed steps; three variants, their steps "
                           "compiled for the CPU too")
    if args.xla_flags:  # read when JAX starts its backend: before the first trainer is built
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {args.xla_flags}".strip()
        print(f"XLA_FLAGS={os.environ['XLA_FLAGS']}")
    flops = training_flops_per_sequence(bert_config_for_size(args.model_size, args.vocab), args.seq, args.pred)
    for name in args.variants:
        print(f"{name:28} one block keeps {kept_for_backward(name, args.model_size, args.vocab, args.seq) / 1024:.1f} "
              f"KiB per token for its backward ({args.model_size}, length {args.seq})", flush=True)
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        config = step_config(folder, args, hidden_dropout_prob=0.0)
        for name in args.variants if args.compile_for else ():
            c = compiled_counts(name, config, args.compile_for)
            said = f"did not compile: {c.error}" if c.error else (
                f"{c.flops / 1e12:.3f} TFLOP, {c.bytes_accessed / 1e9:.2f} GB accessed (the compiler's count), "
                f"temporaries {c.memory['temporaries'] / 2**30:.2f} GiB")
            print(f"{name:28} compiled for {args.compile_for}, one step: {said}", flush=True)
        for name in args.variants if args.steps else ():
            results[name] = time_variant(name, config, args.steps)
            r = results[name]
            print(f"{name:28} {r['rate']:10.1f} sequences/s ({r['rate'] * flops / 1e12:.2f} TFLOP/s); first call "
                  f"{r['first']:.1f} s; loss {r['loss']:.5f}", flush=True)
    base = results.get("base")
    if base:
        for name, r in results.items():
            print(f"{name:28} {r['rate'] / base['rate']:.3f}x base; loss {r['loss'] - base['loss']:+.2e} from base")


if __name__ == "__main__":
    main()
