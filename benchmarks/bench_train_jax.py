"""Training throughput of the JAX backend: sequences/s and model FLOPs utilisation (MFU), and input speed.

Usage: python benchmarks/bench_train_jax.py [--model_size L12-H768] [--batch 256] [--steps 20]
           [--steps_per_execution 10] [--precision auto|bfloat16|float32] [--dropout 0] [--peak_tflops 989]
           [--profile DIR] [--data_dir CREATE_DATA_FOLDER] [--smoke]

Runs without TensorFlow (JAX and Keras 3 only). The whole training step of BERT (masked-position MLM,
NSP, AdamW, global-norm clipping) on random BERT-schema shards of length 128, through the JAX trainer
and its input pipeline. FLOPs per sequence:
:func:`tpu_pretrain.models.bert_config.training_flops_per_sequence`.
MFU is stated against (1) ``--peak_tflops`` if given, else the accelerator's published dense peak for the
precision when the device is known (:mod:`tpu_pretrain.core.peaks`: one device's times the number of
devices, which the sequences/s are measured over), and (2) the best matmul measured here in the training precision
(a large square one and the model's own GEMM shapes), which no training step can beat.
The input pipeline is timed alone too: it must produce sequences faster than the step consumes them.
``--profile DIR``: after the timing, one call traced with ``jax.profiler`` (the call that was timed; another
``--profile_steps`` count is compiled inside the trace, and an H200's trace of such a call held no kernels on its
streams): the device time per step by kind of kernel and by part of the model (:mod:`device_profile`), printed
and written to ``DIR/profile.json`` beside the trace and the optimised HLO (what a GPU session brings back).
``--data_dir``: the step on a ``create-data`` folder instead (the command's workload: its predictions per sequence,
documents apart where packed; MLM-only FLOPs where the data has no next-sentence pairs).
``--smoke``: L2-H128 on a tiny vocab for a few steps, a short matmul reading, the profile into a temporary folder
(seconds; meaningless figures).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("KERAS_BACKEND", "jax")


import device_profile  # noqa: E402
from support import parse_args, write_random_data_folder  # noqa: E402

from tpu_pretrain.config import Config  # noqa: E402
from tpu_pretrain.core.peaks import group_peak  # noqa: E402
from tpu_pretrain.models.bert_config import bert_config_for_size, training_flops_per_sequence  # noqa: E402

SMOKE_STEP = {"model_size": "L2-H128", "batch": 4, "seq": 32, "pred": 5, "vocab": 1000, "steps": 2}


def add_step_arguments(parser: argparse.ArgumentParser, batch: int, steps: int, steps_per_execution: int) -> None:
    """The step's shape and how many steps are timed, as the step benchmarks take them."""
    parser.add_argument("--model_size", default="L12-H768")
    parser.add_argument("--batch", type=int, default=batch)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--pred", type=int, default=20)
    parser.add_argument("--vocab", type=int, default=30522)
    parser.add_argument("--steps", type=int, default=steps, help="timed steps (a multiple of steps_per_execution)")
    parser.add_argument("--steps_per_execution", type=int, default=steps_per_execution)


def step_config(folder: str, args: argparse.Namespace, **settings) -> Config:
    """A JAX run of the step's shape (``args``) on random BERT-schema shards written to ``folder``, or on the data in
    ``args.data_dir`` where given (its length, predictions and vocab: :func:`data_shape`)."""
    data = getattr(args, "data_dir", None)
    if data is None:
        write_random_data_folder(folder, max(256, args.batch * 4), args.seq, args.pred, args.vocab)
    return Config.load(data_dir=str(data or folder), output_dir=folder, model_size=args.model_size, backend="jax",
                       train_batch_size=args.batch, num_train_steps=100_000, num_warmup_steps=100,
                       steps_per_execution=args.steps_per_execution, **settings)


def data_shape(data_dir: Path) -> tuple[int, int, int, bool]:
    """A ``create-data`` folder's length, masked positions per sequence, vocab size, and whether its rows are MLM only
    (no next-sentence pairs), from its manifest."""
    manifest = json.loads((Path(data_dir) / "manifest.json").read_text())
    settings = manifest["settings"]
    return (settings["max_seq_length"], settings["max_predictions_per_seq"], manifest["vocab_size"],
            bool(settings.get("no_nsp")))


def flops_per_sequence(cfg, seq: int, pred: int, mlm_only: bool = False) -> float:
    """:func:`training_flops_per_sequence`, less the pooler and NSP head an MLM-only model does not have."""
    flops = training_flops_per_sequence(cfg, seq, pred)
    return flops - 3 * (2 * cfg.hidden_size**2 + 4 * cfg.hidden_size) if mlm_only else flops


def matmul_rate(dtype: str, m: int, k: int, n: int, seconds: float) -> float:
    """FLOP/s of an (m x k) @ (k x n) matmul in ``dtype`` on the default device, timed over ``seconds``."""
    import jax
    import jax.numpy as jnp

    a, b = jnp.full((m, k), 0.01, dtype), jnp.full((k, n), 0.01, dtype)
    f = jax.jit(lambda x, y: jnp.sum(x @ y, dtype=jnp.float32))
    f(a, b).block_until_ready()
    runs, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        f(a, b).block_until_ready()
        runs += 1
    return 2.0 * m * k * n * runs / (time.perf_counter() - start)


def measured_peak(dtype: str, square: int, shapes: list[tuple[int, int, int]], seconds: float) -> float:
    """One device's best matmul rate over a large square matmul and the model's own GEMM shapes: a training step is
    made of such matmuls plus slower work, so a sound step cannot beat the best of them (a single square chain
    could be beaten: 108.7% was reported against a 2048^3 chain on a CPU)."""
    readings = [(square, square, square), *shapes]
    return max(matmul_rate(dtype, *shape, seconds / len(readings)) for shape in readings)


def warmed_trainer(config: Config):
    """``(trainer, first)``: the JAX trainer of ``config`` after two warm-up calls, the first of which compiles, timed
    with the build as ``first`` (seconds)."""
    from tpu_pretrain.jax_backend.trainer import JaxTrainer

    start = time.perf_counter()
    trainer = JaxTrainer(config)
    trainer.train_steps(trainer.steps_per_execution)
    first = time.perf_counter() - start
    trainer.train_steps(trainer.steps_per_execution)
    return trainer, first


def time_training(config: Config, steps: int) -> dict:
    """The JAX trainer of ``config`` timed: warmed (:func:`warmed_trainer`), then ``steps`` steps: sequences/s
    (``rate``), the share of them the devices waited on input (``wait``), their mean loss, the warm-up's ``first``
    and the trainer, its input closed (the other benchmarks time their steps the same way through this)."""
    trainer, first = warmed_trainer(config)
    start = time.perf_counter()
    metrics = trainer.train_steps(steps)
    rate = steps * config.train.train_batch_size / (time.perf_counter() - start)
    trainer.close()
    return {"rate": rate, "first": first, "wait": metrics["input_wait_share"], "loss": float(metrics["loss"]),
            "trainer": trainer}


def profile(trainer, steps: int, out: Path, hlo: Path) -> None:
    """``steps`` steps traced: the device time by kind and model part, printed and kept in ``out``."""
    import jax

    with tempfile.TemporaryDirectory() as trace:
        with jax.profiler.trace(trace):
            trainer.train_steps(steps)
        summary = device_profile.breakdown(Path(trace), hlo, steps)
        device_profile.keep(Path(trace), hlo, out, summary)
    trainer.close()
    device_profile.show(summary)


def input_rate(trainer, batches: int) -> float:
    """Sequences/s the input pipeline delivers alone (reading, decoding, batching; the trainer's own input is
    read by its prefetch thread, so this opens another)."""
    from tpu_pretrain.jax_backend.input import TrainingBatches

    t, d = trainer.config.train, trainer.config.data
    source = TrainingBatches(trainer.data.train_files, t.train_batch_size, d.max_seq_length,
                             d.max_predictions_per_seq, seed=t.train_seed)
    next(source)
    start = time.perf_counter()
    for _ in range(batches):
        next(source)
    seconds = time.perf_counter() - start
    source.close()
    return batches * t.train_batch_size / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_step_arguments(parser, batch=32, steps=4, steps_per_execution=1)
    parser.add_argument("--precision", default="auto", choices=("auto", "bfloat16", "float32"))
    parser.add_argument("--dropout", type=float, default=0.0, help="hidden and attention dropout (default 0, the "
                        "modern recipe's, which takes the fused attention; 0.1, BERT's, keeps attention explicit)")
    parser.add_argument("--peak_tflops", type=float, default=0.0,
                        help="the devices' peak, all together, to state MFU against")
    parser.add_argument("--matmul_size", type=int, default=0, help="0: 8192 on an accelerator, 2048 on a CPU")
    parser.add_argument("--matmul_seconds", type=float, default=2.0, help="how long the peak reading runs")
    parser.add_argument("--profile", type=Path, default=None, help="trace steps after the timing; results here")
    parser.add_argument("--profile_steps", type=int, default=0,
                        help="steps traced (default: one call of --steps_per_execution, the call that was timed)")
    parser.add_argument("--data_dir", type=Path, default=None,
                        help="a create-data folder to train on instead of random data (its length, predictions, vocab "
                        "and documents: the command's own step; --seq, --pred and --vocab are then the data's)")
    args = parse_args(parser, smoke={**SMOKE_STEP, "matmul_size": 512, "matmul_seconds": 0.2, "profile_steps": 2},
                      what="L2-H128, vocab 1000, batch 4 x 32 tokens, 2 timed steps, a 512^3 matmul reading, "
                           "the profile into a temporary folder")
    scratch = Path(tempfile.mkdtemp(prefix="bench_train_jax_"))
    profile_out = args.profile or (scratch / "profile" if args.smoke else None)
    if profile_out is not None:  # XLA reads its flags when JAX starts: before the trainer is built
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {device_profile.dump_flags(scratch / 'hlo')}"

    mlm_only = False
    if args.data_dir is not None:
        args.seq, args.pred, args.vocab, mlm_only = data_shape(args.data_dir)
    cfg = bert_config_for_size(args.model_size, args.vocab)
    flops = flops_per_sequence(cfg, args.seq, args.pred, mlm_only)
    with tempfile.TemporaryDirectory() as folder:
        config = step_config(folder, args, mixed_precision=args.precision, hidden_dropout_prob=args.dropout)
        timed = time_training(config, args.steps)
        trainer, rate, first, wait = timed["trainer"], timed["rate"], timed["first"], timed["wait"]
        feed = input_rate(trainer, max(4, args.steps))
        if profile_out is not None:
            profile(trainer, args.profile_steps or trainer.steps_per_execution, profile_out, scratch / "hlo")
    shutil.rmtree(scratch, ignore_errors=True)
    devices = trainer.devices
    dtype = "bfloat16" if devices.precision == "bfloat16" else "float32"
    size = args.matmul_size or (2048 if devices.kind == "cpu" else 8192)
    cfg_h, tokens = cfg.hidden_size, args.batch * args.seq // devices.num_replicas  # one device's share
    gemms = [(tokens, cfg_h, cfg.intermediate_size), (tokens, cfg.intermediate_size, cfg_h), (tokens, cfg_h, cfg_h),
             (args.batch * args.pred // devices.num_replicas, cfg_h, args.vocab)]
    measured = measured_peak(dtype, size, gemms, args.matmul_seconds) * devices.num_replicas
    kind = getattr(devices.devices[0], "device_kind", "") if devices.kind != "cpu" else ""
    peak = args.peak_tflops * 1e12 or group_peak(kind, devices.precision, devices.num_replicas)
    print(f"device: {devices.describe()} ({getattr(devices.devices[0], 'device_kind', '?')}); model "
          f"{args.model_size}, batch {args.batch}, length {args.seq}, {args.pred} predictions, vocab {args.vocab}"
          f"{f', data {args.data_dir}' if args.data_dir else ''}: "
          f"{flops / 1e9:.2f} GFLOP per training sequence")
    print(f"training: {rate:.1f} sequences/s ({rate * flops / 1e12:.2f} TFLOP/s); first call {first:.1f} s; "
          f"the devices waited on input {wait:.1%} of the time")
    print(f"MFU vs the best {dtype} matmul measured here ({size}^3 and the model's own GEMM shapes, "
          f"{measured / 1e12:.2f} TFLOP/s over {devices.num_replicas} device(s)): {rate * flops / measured:.1%}")
    if peak:
        print(f"MFU vs the peak {peak / 1e12:.0f} TFLOP/s: {rate * flops / peak:.1%} (aim >= 40% on an accelerator)")
    print(f"input alone: {feed:.0f} sequences/s ({feed / rate:.1f}x what training consumed)")


if __name__ == "__main__":
    main()
