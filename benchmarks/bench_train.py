"""Training throughput: sequences/s, model FLOPs utilisation, and the speed-up over stock bert4keras.

Usage: python benchmarks/bench_train.py [--model_size L12-H768] [--batch 8] [--steps 4] [--smoke]

Model FLOPs per sequence (multiply-add = 2 FLOPs; backward = 2x forward, so training = 3x forward):
    forward = L * (T * (8 H^2 + 4 H I) + 4 T^2 H)      encoder: Q,K,V,O and FFN matmuls, QK^T and AV
            + P * (2 H^2 + 2 H V)                       MLM head at the P masked positions (tied output)
            + 2 H^2 + 4 H                               pooler and NSP
    train   = 3 * forward
MFU = sequences/s * train FLOPs per sequence / (FLOP/s of a 2048x2048 float32 matmul measured here).
The baseline is bert4keras's own ``with_mlm=True`` head (full-vocabulary softmax at every token) with
NSP, compiled with the same AdamW and trained with ``model.fit``, on the same machine in the same run.
``--smoke``: L2-H128 on a tiny vocab for a few steps, a short matmul reading (seconds; meaningless figures).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# isort: off
import tpu_pretrain  # noqa: F401  (Keras 2 before TensorFlow)
import numpy as np
import tensorflow as tf

# isort: on
from support import parse_args, write_random_data_folder

from tpu_pretrain.config import Config
from tpu_pretrain.core.schedules import planned
from tpu_pretrain.models.bert_config import bert_config_for_size, training_flops_per_sequence
from tpu_pretrain.tf_backend.accelerator import detect_accelerator, matmul_peak_flops
from tpu_pretrain.tf_backend.optimization import create_optimizer
from tpu_pretrain.tf_backend.trainer import Trainer


def bench_ours(args, data_dir: str, accelerator) -> tuple[float, float]:
    """(sequences/s, seconds to first step) of our Trainer: masked-position MLM, NSP, AdamW."""
    config = Config.load(data_dir=data_dir, output_dir=data_dir, model_size=args.model_size,
                         train_batch_size=args.batch, num_train_steps=10_000, num_warmup_steps=100,
                         shuffle_buffer_size=64, max_seq_length=args.seq, max_predictions_per_seq=args.pred,
                         steps_per_execution=1, jit_compile=args.jit)
    start = time.perf_counter()
    trainer = Trainer(config, accelerator)
    trainer.train_steps(1)
    first = time.perf_counter() - start
    trainer.train_steps(args.warmup)
    start = time.perf_counter()
    trainer.train_steps(args.steps)
    return args.steps * args.batch / (time.perf_counter() - start), first


def bench_stock(args, cfg) -> float:
    """Sequences/s of stock bert4keras (full-vocab MLM softmax at all tokens + NSP) with model.fit."""
    from bert4keras.models import build_transformer_model

    model = build_transformer_model(
        model="bert", with_mlm=True, with_nsp=True, vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        intermediate_size=cfg.intermediate_size, hidden_act="gelu", dropout_rate=0.1, max_position=512,
        sequence_length=args.seq)
    schedule = planned(Config.load(learning_rate=1e-4, num_train_steps=10_000, num_warmup_steps=100).train)
    optimizer = create_optimizer(schedule=schedule, variables=model.trainable_variables)
    model.compile(optimizer=optimizer, loss=["sparse_categorical_crossentropy", "sparse_categorical_crossentropy"])
    rng = np.random.default_rng(0)
    n = args.batch
    ids = rng.integers(5, cfg.vocab_size, (n, args.seq))
    segments = (np.arange(args.seq)[None] >= args.seq // 2).astype(int).repeat(n, 0)
    mlm_weights = np.zeros((n, args.seq), np.float32)
    mlm_weights[:, 1:1 + args.pred] = 1.0
    nsp = rng.integers(0, 2, (n, 1))
    ds = tf.data.Dataset.from_tensors(((ids, segments), (nsp, ids), (np.ones(n, np.float32), mlm_weights)))
    ds = ds.repeat()
    model.fit(ds, steps_per_epoch=args.warmup + 1, epochs=1, verbose=0)
    start = time.perf_counter()
    model.fit(ds, steps_per_epoch=args.steps, epochs=1, verbose=0)
    return args.steps * args.batch / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model_size", default="L12-H768")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--pred", type=int, default=20)
    parser.add_argument("--vocab", type=int, default=30522)
    parser.add_argument("--steps", type=int, default=4, help="timed steps")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps after the first")
    parser.add_argument("--jit", default="auto", choices=("auto", "on", "off"))
    parser.add_argument("--skip_baseline", action="store_true")
    parser.add_argument("--matmul_seconds", type=float, default=2.0, help="how long each peak reading runs")
    args = parse_args(parser, smoke={"model_size": "L2-H128", "batch": 4, "seq": 32, "pred": 5, "vocab": 1000,
                                     "steps": 2, "matmul_seconds": 0.2},
                      what="L2-H128, vocab 1000, batch 4 x 32 tokens, 2 timed steps, 0.2 s matmul readings")

    accelerator = detect_accelerator("auto", jit_compile=args.jit)
    cfg = bert_config_for_size(args.model_size, args.vocab)
    flops = training_flops_per_sequence(cfg, args.seq, args.pred, "tensorflow")
    peak = matmul_peak_flops(2048, seconds=args.matmul_seconds)
    print(f"device: {accelerator.describe()}; peak (2048^3 float32 matmul): {peak / 1e9:.1f} GFLOP/s")
    print(f"model {args.model_size}, batch {args.batch}, length {args.seq}, {args.pred} predictions, "
          f"vocab {args.vocab}: {flops / 1e9:.2f} GFLOP per training sequence (3 x forward)")
    with tempfile.TemporaryDirectory() as folder:
        write_random_data_folder(folder, max(64, args.batch * 4), args.seq, args.pred, args.vocab)
        ours, first = bench_ours(args, folder, accelerator)
    mfu = ours * flops / peak
    print(f"ours:  {ours:.2f} sequences/s, MFU {mfu:.1%} of the measured matmul rate; "
          f"time to first step {first:.1f} s")
    peak_after = matmul_peak_flops(2048, seconds=args.matmul_seconds)
    print(f"peak re-measured after: {peak_after / 1e9:.1f} GFLOP/s (MFU vs that: {ours * flops / peak_after:.1%})")
    best = max(peak, peak_after)  # the CPU's clock wanders: the conservative figure uses the higher peak
    print(f"MFU against the higher peak: {ours * flops / best:.1%} (goal >= 65%)")
    if not args.skip_baseline:
        stock = bench_stock(args, cfg)
        stock_flops = flops + 3 * (args.seq - args.pred) * (2 * cfg.hidden_size**2 + 2 * cfg.hidden_size * args.vocab)
        print(f"stock bert4keras full-vocab MLM + model.fit: {stock:.2f} sequences/s "
              f"({stock * stock_flops / best:.1%} of peak counting its full-vocabulary head); "
              f"speed-up {ours / stock:.2f}x (goal >= 1.25x)")


if __name__ == "__main__":
    main()
