"""The classic (Google BERT) and the modern recipe at equal training compute: held-out MLM figures per FLOP.

Usage: python benchmarks/bench_recipe.py CORPUS [--doc_separator %] [--classic_steps 400] [--model_size L2-H128]
       python benchmarks/bench_recipe.py --smoke   (the built-in sample corpus, a few steps of length 64)

Both recipes get the same corpus, vocab, model shape, peak learning rate, batch and seed, and the same
training FLOPs: the classic run trains ``--classic_steps`` steps and the modern run as many steps as
that compute buys. FLOPs are counted as the accelerator spends them (every position of a sequence,
padding included, and every masked-position slot of the MLM head:
``tpu_pretrain.models.bert_config.training_flops_per_sequence``, as bench_train.py counts them),
so packing shows up as more real tokens per FLOP and the modern recipe's larger masked-position
head as fewer steps. Both are scored on the same eval shards, masked at 0.15: the modern data
folder's (packed, one segment) and the classic one's (sentence pairs, two segments); the held-out
documents are the same in both folders (same seed). Printed: fill, steps, real tokens trained on,
sequences/s, and held-out MLM loss and accuracy on both eval sets.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from support import parse_args, where_the_work_went

import tpu_pretrain  # noqa: F401  (Keras 2 before TensorFlow)
from tpu_pretrain.config import Config
from tpu_pretrain.data.create import create_pretraining_data
from tpu_pretrain.data.data_folder import load_manifest, read_data_info
from tpu_pretrain.data.sample_corpus import write_sample_corpus
from tpu_pretrain.data.vocab import build_vocab
from tpu_pretrain.export.evaluate import held_out_metrics
from tpu_pretrain.export.rebuild import load_trained_model
from tpu_pretrain.models.bert_config import bert_config_for_size, training_flops_per_sequence
from tpu_pretrain.training import train

RECIPES = ("classic", "modern")
SMOKE_CHARS = 60_000  # of the built-in sample corpus


def make_data(args, vocab: str, work: Path) -> dict[str, Path]:
    folders = {}
    for recipe in RECIPES:
        folders[recipe] = work / f"data-{recipe}"
        create_pretraining_data(Config.load(
            input=[str(c) for c in args.corpus], doc_separator=args.doc_separator, vocab_file=vocab,
            output_dir=str(folders[recipe]), recipe=recipe, max_seq_length=args.max_seq_length,
            max_predictions_per_seq=0, dupe_factor=args.dupe_factor, eval_fraction=args.eval_fraction,
            do_whole_word_mask=True, workers=1))
    return folders


def flops_per_sequence(args, data_dir: Path, vocab_size: int) -> float:
    cfg = bert_config_for_size(args.model_size, vocab_size)
    manifest = load_manifest(data_dir)
    flops = training_flops_per_sequence(cfg, args.max_seq_length, manifest.settings["max_predictions_per_seq"])
    if manifest.settings["no_nsp"]:
        flops -= 3 * (2 * cfg.hidden_size**2 + 4 * cfg.hidden_size)  # no pooler and NSP head
    return flops


def scores(run: Path, eval_dirs: dict[str, Path]) -> dict[str, dict]:
    out = {}
    for name, data_dir in eval_dirs.items():
        info = read_data_info(str(data_dir))
        trained = load_trained_model(run, max_predictions_per_seq=info.max_predictions_per_seq)
        metrics, _ = held_out_metrics(trained, str(data_dir), 32, 0)  # every eval record
        out[name] = metrics
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("corpus", type=Path, nargs="*", help="text corpora (--smoke: the built-in sample)")
    parser.add_argument("--doc_separator", default="")
    parser.add_argument("--vocab_size", type=int, default=4000)
    parser.add_argument("--model_size", default="L2-H128")
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--classic_steps", type=int, default=400)
    parser.add_argument("--learning_rate", type=float, default=2e-3)
    parser.add_argument("--dupe_factor", type=int, default=3)
    parser.add_argument("--eval_fraction", type=float, default=0.05)
    parser.add_argument("--work", type=Path, default=None, help="Folder for the data and runs (default: a temp one).")
    args = parse_args(parser, smoke={"vocab_size": 500, "max_seq_length": 64, "batch": 4, "classic_steps": 4,
                                     "dupe_factor": 1, "eval_fraction": 0.1},
                      what=f"the built-in sample corpus ({SMOKE_CHARS:,} characters), a 500-token vocab, length 64, "
                           "batch 4, 4 classic steps")
    if not args.corpus and not args.smoke:
        parser.error("give at least one CORPUS (or --smoke)")
    logging.basicConfig(level=logging.WARNING)
    work = args.work or Path(tempfile.mkdtemp(prefix="bench_recipe_"))
    if not args.corpus:
        args.corpus = [write_sample_corpus(work / "sample.txt", max_chars=SMOKE_CHARS)]
    vocab = build_vocab(Config.load(input=[str(c) for c in args.corpus], doc_separator=args.doc_separator,
                                    vocab_size=args.vocab_size, output_dir=str(work)))
    folders = make_data(args, vocab.path, work)
    flops = {recipe: flops_per_sequence(args, folders[recipe], vocab.vocab_size) for recipe in RECIPES}
    budget = args.classic_steps * args.batch * flops["classic"]
    rows = {}
    for recipe in RECIPES:
        steps = round(budget / (args.batch * flops[recipe]))
        started = time.perf_counter()
        result = train(data_dir=str(folders[recipe]), output_dir=str(work / f"run-{recipe}"), recipe=recipe,
                       model_size=args.model_size, train_batch_size=args.batch, num_train_steps=steps,
                       learning_rate=args.learning_rate, eval_every_steps=0, max_eval_steps=1,
                       log_every_steps=max(1, steps // 4), save_checkpoints_steps=steps, progress=False)
        fill = load_manifest(folders[recipe]).fill()
        rows[recipe] = {"steps": steps, "seconds": time.perf_counter() - started, "fill": fill,
                        "tokens": steps * args.batch * args.max_seq_length * fill,
                        "seq_per_s": result.examples_per_second,
                        "scores": scores(work / f"run-{recipe}", {"packed": folders["modern"],
                                                                  "pairs": folders["classic"]})}
    print(f"corpus: {', '.join(map(str, args.corpus))}; model {args.model_size}, length {args.max_seq_length}, "
          f"batch {args.batch}, peak learning rate {args.learning_rate}; {budget / 1e12:.2f} training TFLOP each "
          f"(classic {flops['classic'] / 1e6:.0f}, modern {flops['modern'] / 1e6:.0f} MFLOP per sequence)")
    print("recipe   fill  steps  real tokens  seq/s   | packed eval (0.15): loss  acc | pairs eval (0.15): loss  acc")
    for recipe, r in rows.items():
        p, q = r["scores"]["packed"], r["scores"]["pairs"]
        print(f"{recipe:8} {r['fill']:.2f} {r['steps']:6d} {r['tokens'] / 1e6:9.2f}M {r['seq_per_s']:7.1f}  | "
              f"{p['mlm_loss']:24.3f} {p['mlm_accuracy']:.3f} | {q['mlm_loss']:23.3f} {q['mlm_accuracy']:.3f}")
    gain = rows["classic"]["scores"]["packed"]["mlm_loss"] - rows["modern"]["scores"]["packed"]["mlm_loss"]
    where = where_the_work_went(args, work)
    print(f"modern - classic held-out loss (packed eval): {-gain:+.3f}; {where}")


if __name__ == "__main__":
    main()
