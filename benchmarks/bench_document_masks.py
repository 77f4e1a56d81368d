"""Document masks on vs off at equal training compute: held-out MLM loss per corpus, on the JAX backend.

Usage: python benchmarks/bench_document_masks.py CORPUS[:SEP] [CORPUS[:SEP] ...] [--model_family modernbert]
           [--model_size L2-H128] [--steps 300] [--results FILE]
       python benchmarks/bench_document_masks.py --smoke   (the built-in sample corpus, a tiny model, a few steps)

Each corpus (``PATH``, or ``PATH:SEP`` for documents separated by ``SEP`` lines, e.g. ``zh_fortunes.txt:%``) gets
its own vocab and one ``create-data --recipe modern`` data folder (packed rows, MLM only, eval shards masked at
0.15). Two runs train on it from the same seed, batch, steps and learning rate: ``--document_masks on`` (a token
attends only to its own document, each document's positions start at 0) and ``off`` (every token of a packed row
sees the whole row). Masks change which scores count, not how many are computed (the score matrix is dense on every
path), so the same steps are the same training FLOPs; the FLOPs per sequence are the trainer's own count.

Both models are scored on the same eval records three ways: as the run was trained (``own``: what
``tpu-pretrain evaluate`` reports), and both with masks ``off`` and both with masks ``on`` (the loaded model's
``document_separator`` set or cleared). ``own`` is the fair comparison of the two trainings (each model read as it
learned to read); the crossed columns show how much each model depends on the setting it was trained with. The rows
are appended to ``--results`` (JSON lines).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("KERAS_BACKEND", "jax")  # the JAX backend trains here, in this process

from support import corpus_specs, modern_data, parse_args, where_the_work_went  # noqa: E402

import tpu_pretrain  # noqa: E402,F401  (the package's environment settings first)
from tpu_pretrain.config import Config  # noqa: E402
from tpu_pretrain.core.resolve import RunPlan  # noqa: E402
from tpu_pretrain.data.data_folder import read_data_info  # noqa: E402
from tpu_pretrain.export.evaluate import held_out_metrics  # noqa: E402
from tpu_pretrain.export.rebuild import load_trained_model  # noqa: E402
from tpu_pretrain.jax_backend.input import separator_id  # noqa: E402
from tpu_pretrain.training import train  # noqa: E402

SETTINGS = ("on", "off")
SCORED = ("own", "off", "on")
SMOKE_CHARS = 40_000  # of the built-in sample corpus


def run_settings(args, masks: str, data: Path, run: Path) -> dict:
    """What ``train`` gets: the same everything but ``document_masks``."""
    return dict(data_dir=str(data), output_dir=str(run), backend="jax", model_family=args.model_family,
                recipe="modern", model_size=args.model_size, train_batch_size=args.batch, num_train_steps=args.steps,
                learning_rate=args.learning_rate, train_seed=args.seed, document_masks=masks, eval_every_steps=0,
                max_eval_steps=1, log_every_steps=max(1, min(50, args.steps // 2)), steps_per_execution=1,
                save_checkpoints_steps=args.steps, session_hours=-1)


def score(run: Path, data: Path, masks: str) -> dict:
    """Held-out MLM figures on every eval record, with the run's own masks setting or forced ``off``/``on``."""
    info = read_data_info(str(data))
    trained = load_trained_model(run, max_predictions_per_seq=info.max_predictions_per_seq)
    if masks != "own":
        inner = trained.model.model
        inner.document_separator = (separator_id(RunPlan.resolve(trained.config).model_config, trained.vocab_file)
                                    if masks == "on" else None)
    metrics, examples = held_out_metrics(trained, str(data), 32, 0)
    return {**metrics, "examples": examples}


def bench_corpus(args, corpus: Path, separator: str, work: Path) -> dict:
    data = modern_data(args, corpus, separator, work)[1]
    flops = RunPlan.resolve(Config.load(**run_settings(args, "on", data, work / "x"))).training_flops_per_sequence()
    rows = {}
    for masks in SETTINGS:
        run = work / f"run-{masks}"
        started = time.perf_counter()
        result = train(**run_settings(args, masks, data, run), progress=False)
        rows[masks] = {"steps": result.steps, "seconds": time.perf_counter() - started,
                       "seq_per_s": result.examples_per_second,
                       "tflop": result.steps * args.batch * flops / 1e12,
                       "scores": {how: score(run, data, how) for how in SCORED}}
    return {"corpus": str(corpus), "separator": separator, "model_family": args.model_family,
            "model_size": args.model_size, "max_seq_length": args.max_seq_length, "batch": args.batch,
            "steps": args.steps, "learning_rate": args.learning_rate, "seed": args.seed,
            "mflop_per_sequence": flops / 1e6, "rows": rows}


def print_table(results: list[dict]) -> None:
    first = results[0]
    print(f"\n{first['model_family']} {first['model_size']}, length {first['max_seq_length']}, batch {first['batch']}, "
          f"{first['steps']} steps, peak learning rate {first['learning_rate']}, seed {first['seed']}; held-out MLM "
          "on every eval record (masked at 0.15), scored with each run's own masks and with both off / both on")
    print("corpus                 masks  TFLOP  seconds  seq/s | own loss  acc   | off loss  acc   | on loss   acc")
    for r in results:
        name = Path(r["corpus"]).name + (f":{r['separator']}" if r["separator"] else "")
        for masks, row in r["rows"].items():
            s = row["scores"]
            print(f"{name[:22]:22} {masks:5} {row['tflop']:6.3f} {row['seconds']:8.1f} {row['seq_per_s']:6.1f} | "
                  + " | ".join(f"{s[h]['mlm_loss']:8.3f} {s[h]['mlm_accuracy']:.3f}" for h in SCORED))
    for r in results:
        on, off = (r["rows"][m]["scores"] for m in SETTINGS)
        name = Path(r["corpus"]).name
        print(f"{name}: masks on - off held-out MLM loss: own {on['own']['mlm_loss'] - off['own']['mlm_loss']:+.3f}, "
              f"both scored off {on['off']['mlm_loss'] - off['off']['mlm_loss']:+.3f}, both scored on "
              f"{on['on']['mlm_loss'] - off['on']['mlm_loss']:+.3f} ({on['own']['examples']} eval sequences)",
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("corpus", nargs="*", help="text corpora, PATH or PATH:SEP (--smoke: the built-in sample)")
    parser.add_argument("--model_family", default="modernbert", choices=("modernbert", "bert"))
    parser.add_argument("--model_size", default="L2-H128")
    parser.add_argument("--vocab_size", type=int, default=8000, help="per corpus (zh_fortunes needs 7,062 for its "
                        "characters)")
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dupe_factor", type=int, default=2)
    parser.add_argument("--eval_fraction", type=float, default=0.05)
    parser.add_argument("--results", type=Path, default=None, help="JSON lines, one per corpus, appended to")
    parser.add_argument("--work", type=Path, default=None, help="Folder for the data and runs (default: a temp one).")
    args = parse_args(parser, smoke={"vocab_size": 400, "model_size": "L2-H128", "max_seq_length": 64, "batch": 4,
                                     "steps": 2, "dupe_factor": 1, "eval_fraction": 0.1},
                      what=f"the built-in sample corpus ({SMOKE_CHARS:,} characters), a 400-token vocab, L2-H128, "
                           "length 64, batch 4, 2 steps")
    logging.basicConfig(level=logging.WARNING)
    work, specs = corpus_specs(parser, args, "bench_document_masks_", SMOKE_CHARS)
    started, results = time.perf_counter(), []
    for i, (path, separator) in enumerate(specs):
        results.append(bench_corpus(args, path, separator, work / f"{i}-{path.stem}"))
        if args.results:
            with open(args.results, "a") as handle:
                handle.write(json.dumps(results[-1]) + "\n")
        print_table(results[-1:])
    if len(results) > 1:
        print_table(results)
    where = where_the_work_went(args, work)
    print(f"{time.perf_counter() - started:.0f} s in all; {where}")


if __name__ == "__main__":
    main()
