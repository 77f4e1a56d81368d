"""The same run on both training backends: held-out MLM and NSP figures after N steps, and their speed.

Usage: python benchmarks/bench_backends.py [--steps 200] [--model_size L2-H128] [--batch 32] [--seeds 0 1] [--smoke]

Builds a data folder from the built-in sample corpus, trains the same configuration with ``--backend
tensorflow`` and ``--backend jax`` (each in its own process, as the CLI runs them) for several seeds,
and prints each run's final held-out figures. The backends read the records in different orders (each
a pure function of the seed), so their figures differ by noise; the spread over seeds on one backend is
that noise. ``--smoke``: a small corpus and vocab, 4 steps, one seed (seconds beyond the two processes' start-up;
meaningless figures).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from support import parse_args  # noqa: E402

from tpu_pretrain.config import Config  # noqa: E402
from tpu_pretrain.data.create import create_pretraining_data  # noqa: E402
from tpu_pretrain.data.sample_corpus import write_sample_corpus  # noqa: E402
from tpu_pretrain.data.vocab import build_vocab  # noqa: E402


def make_data(root: Path, args) -> str:
    corpus = write_sample_corpus(root / "corpus.txt", max_chars=args.corpus_chars)
    vocab = build_vocab(Config.load(input=[str(corpus)], vocab_size=args.vocab_size, num_unused_tokens=5,
                                    output_dir=str(root)))
    create_pretraining_data(Config.load(input=[str(corpus)], vocab_file=vocab.path, output_dir=str(root / "data"),
                                        max_seq_length=64, max_predictions_per_seq=10, dupe_factor=2, num_shards=2,
                                        eval_fraction=0.1, workers=2))
    return str(root / "data")


def train(data_dir: str, run: Path, backend: str, seed: int, args) -> dict:
    command = [sys.executable, "-m", "tpu_pretrain", "train", "--backend", backend, "--data_dir", data_dir,
               "--output_dir", str(run), "--model_size", args.model_size, "--train_batch_size", str(args.batch),
               "--num_train_steps", str(args.steps), "--num_warmup_steps", str(args.steps // 10),
               "--learning_rate", "1e-3", "--save_checkpoints_steps", str(args.steps), "--eval_every_steps", "0",
               "--max_eval_steps", "1000", "--steps_per_execution", "10",
               # at least two calls: the first (graph build, compilation) is not timed
               "--log_every_steps", str(min(50, max(1, args.steps // 2))),
               "--train_seed", str(seed), "--session_hours", "-1"]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    if done.returncode:
        raise SystemExit(f"{backend} run failed:\n{done.stderr[-3000:]}")
    return json.loads((run / "train_summary.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--model_size", default="L2-H128")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--corpus_chars", type=int, default=400_000, help="characters of the built-in sample corpus")
    parser.add_argument("--vocab_size", type=int, default=2000)
    args = parse_args(parser, smoke={"steps": 4, "batch": 8, "seeds": [0], "corpus_chars": 60_000, "vocab_size": 500},
                      what="60,000 characters of the sample corpus, a 500-token vocab, 4 steps of batch 8, seed 0")
    with tempfile.TemporaryDirectory() as folder:
        data_dir = make_data(Path(folder), args)
        print(f"{args.model_size}, batch {args.batch}, {args.steps} steps, length 64; held-out figures at the end:")
        for backend in ("tensorflow", "jax"):
            for seed in args.seeds:
                summary = train(data_dir, Path(folder) / f"{backend}-{seed}", backend, seed, args)
                e = summary["final_eval"]
                print(f"  {backend:10s} seed {seed}: MLM loss {e['mlm_loss']:.4f}, accuracy {e['mlm_accuracy']:.4f}, "
                      f"NSP accuracy {e.get('nsp_accuracy', float('nan')):.4f}; "
                      f"{summary['examples_per_second']:.0f} sequences/s ({summary['accelerator']})")


if __name__ == "__main__":
    main()
