"""Does bfloat16 (what a TPU trains in) follow float32? The loss curve and held-out MLM figures of both.

Usage: python benchmarks/bench_bfloat16.py [--model_size L2-H128] [--steps 200] [--batch 32] [--smoke]

The same model, data order and seed are trained twice on the CPU: once in float32, once under Keras's
``mixed_bfloat16`` policy (weights float32, compute bfloat16, loss in float32 from the logits), which is what
the TPU runs. Printed: the train loss every tenth of the run for both, the largest relative gap, and the
held-out MLM loss and accuracy at the end. A gap that grows with training, or a bfloat16 run that learns
less, would call for LayerNorm statistics in float32. Measured when written (2-core CPU, L2-H128, 200 steps
of 32 x 32 synthetic tokens, learning rate 2e-3): train losses at most 1.0% apart (where the curve is
steepest; 2.049 vs 2.027 at the end), held-out MLM loss 2.405 (float32) vs 2.354 (bfloat16), accuracy 0.326
vs 0.328: no loss from bfloat16, so LayerNorm keeps the policy's compute type. ``--smoke``: 2 steps of batch 4
on 32 instances (seconds; meaningless figures).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

# isort: off
import tpu_pretrain  # noqa: F401  (Keras 2 before TensorFlow)
import tensorflow as tf

# isort: on
from pretraining_fixtures import synthetic_data_folder
from support import parse_args

from tpu_pretrain.config import Config
from tpu_pretrain.tf_backend.accelerator import Accelerator
from tpu_pretrain.tf_backend.trainer import Trainer


def curve(data_dir: str, precision: str, args) -> tuple[list[float], dict]:
    config = Config.load(data_dir=data_dir, output_dir=os.path.join(data_dir, "run"), model_size=args.model_size,
                         train_batch_size=args.batch, num_train_steps=args.steps, num_warmup_steps=args.steps // 10,
                         learning_rate=2e-3, hidden_dropout_prob=0.0, shuffle_buffer_size=256, max_eval_steps=4)
    trainer = Trainer(config, Accelerator("cpu", tf.distribute.get_strategy(), precision))
    chunk = max(1, args.steps // 10)
    losses = [trainer.train_steps(chunk)["loss"] for _ in range(args.steps // chunk)]
    return losses, trainer.evaluate()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_size", default="L2-H128")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--instances", type=int, default=256, help="train instances, and as many held out")
    args = parse_args(parser, smoke={"steps": 2, "batch": 4, "instances": 32},
                      what="2 steps of batch 4 on 32 toy instances")
    with tempfile.TemporaryDirectory() as folder:
        synthetic_data_folder(folder, args.instances, args.instances)
        f32, f32_eval = curve(folder, "float32", args)
        bf16, bf16_eval = curve(folder, "bfloat16", args)
    every = max(1, args.steps // 10)
    print(f"{args.model_size}, {args.steps} steps of {args.batch} x 32 tokens; train loss every {every} step(s):")
    print("  float32 ", " ".join(f"{x:.3f}" for x in f32))
    print("  bfloat16", " ".join(f"{x:.3f}" for x in bf16))
    print(f"largest relative gap in the train loss: {max(abs(a - b) / a for a, b in zip(f32, bf16, strict=True)):.2%}")
    for name in ("mlm_loss", "mlm_accuracy"):
        gap = abs(f32_eval[name] - bf16_eval[name]) / f32_eval[name]
        print(f"held-out {name}: float32 {f32_eval[name]:.4f}, bfloat16 {bf16_eval[name]:.4f} ({gap:.2%} apart)")


if __name__ == "__main__":
    main()
