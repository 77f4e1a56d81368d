"""BERT and ModernBERT on the JAX backend at equal training compute: held-out MLM figures per FLOP, per corpus.

Usage: python benchmarks/bench_families.py CORPUS[:SEP] [CORPUS[:SEP] ...] [--bert_steps 160]
           [--bert_size L2-H256] [--modernbert_size L2-H256] [--probe_task TASK|- ...]
       python benchmarks/bench_families.py --smoke   (the built-in sample corpus, tiny models, a few steps)

Each corpus (``PATH``, or ``PATH:SEP`` for documents separated by ``SEP`` lines, e.g. ``zh_fortunes.txt:%``) gets
its own vocab and one ``create-data --recipe modern`` data folder (packed, MLM only, 30% masking in the training
shards, eval shards masked at 0.15), which both families train on and are scored on. Both train with
``backend="jax"`` and the modern recipe, the same batch, sequence length, peak learning rate and seed; BERT
(``--model_family bert``) trains ``--bert_steps`` steps and ModernBERT (``--model_family modernbert``) as many steps
as the same training FLOPs buy. FLOPs per sequence are the project's own count, as the trainer reports them
(``RunPlan.training_flops_per_sequence``): :func:`tpu_pretrain.models.bert_config.training_flops_per_sequence` for
BERT (less its pooler and NSP head, which an MLM-only BERT does not have, as bench_recipe.py counts it) and
:func:`tpu_pretrain.models.modernbert_config.training_flops_per_sequence` for ModernBERT: every position of the
sequence, the masked-position MLM head, backward = 2 x forward, the local layers' attention counted over the whole
sequence (their window is masked, not skipped).

Model shapes: by default the same layers and width (``L2-H256``: BERT's FFN is 4 H wide, ModernBERT's GeGLU 1.5 H,
so the ModernBERT has fewer parameters and FLOPs and takes more steps); ``--modernbert_size`` picks another named
ModernBERT size (e.g. a parameter-matched one). Both parameter counts are printed.

Printed per corpus and family: parameters, FLOPs per sequence, steps, seconds, measured steps/s and sequences/s
(the trainer's rate after its first, compiling, call), held-out MLM loss and accuracy on every eval record. With
``--probe_task`` (one labelled ``text<TAB>label`` file per corpus, in order; ``-`` for none), the project's
downstream probe (``tpu_pretrain.export.probe``, features mode: a ridge classifier on mean-pooled states) of each
run next to the same shape from random weights; it applies to both families (ModernBERT's encoder gives the
mean-pooled states as BERT's does).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("KERAS_BACKEND", "jax")  # both families train on the JAX backend, in this process

from support import corpus_specs, modern_data, parse_args, where_the_work_went  # noqa: E402

import tpu_pretrain  # noqa: E402,F401  (the package's environment settings first)
from tpu_pretrain.config import Config  # noqa: E402
from tpu_pretrain.core.resolve import RunPlan  # noqa: E402
from tpu_pretrain.data.data_folder import read_data_info  # noqa: E402
from tpu_pretrain.export.evaluate import held_out_metrics  # noqa: E402
from tpu_pretrain.export.probe import probe  # noqa: E402
from tpu_pretrain.export.rebuild import load_trained_model  # noqa: E402
from tpu_pretrain.training import train  # noqa: E402

FAMILIES = ("bert", "modernbert")
SMOKE_CHARS = 60_000  # of the built-in sample corpus


def smoke_task(corpus: Path, path: Path, rows: int = 120) -> str:
    """A labelled file from the corpus's lines (long or short, split at the median), for the smoke run's probe."""
    lines = [line.strip() for line in corpus.read_text(encoding="utf-8").splitlines()
             if len(line.strip()) > 20 and "\t" not in line][:rows]
    median = sorted(len(line) for line in lines)[len(lines) // 2]
    path.write_text("".join(f"{line}\t{'long' if len(line) > median else 'short'}\n" for line in lines),
                    encoding="utf-8")
    return str(path)


def run_settings(args, family: str, data: Path, run: Path, steps: int) -> dict:
    """What ``train`` gets for one family: everything but the family and its size is the same for both."""
    size = args.bert_size if family == "bert" else args.modernbert_size
    # Timed in calls of log_every steps, the first (compiling) apart: at least two. One step per compiled call, so
    # a step count that is no multiple of it compiles no second program in the timed part.
    every = max(1, min(args.log_every, steps // 2))
    return dict(data_dir=str(data), output_dir=str(run), backend="jax", model_family=family, recipe="modern",
                model_size=size, train_batch_size=args.batch, num_train_steps=steps,
                learning_rate=args.learning_rate, train_seed=args.seed, eval_every_steps=0, max_eval_steps=1,
                log_every_steps=every, steps_per_execution=1, save_checkpoints_steps=steps, session_hours=-1)


def flops_per_sequence(settings: dict) -> float:
    """The trainer's own count for this run (its RunPlan), less BERT's pooler and NSP head when it has none."""
    plan = RunPlan.resolve(Config.load(**settings))
    flops = plan.training_flops_per_sequence()
    if plan.family.has_nsp and not plan.with_nsp:  # BERT made MLM-only
        hidden = plan.model_config.hidden_size
        flops -= 3 * (2 * hidden**2 + 4 * hidden)
    return flops


def train_family(args, family: str, data: Path, run: Path, steps: int, task: str | None) -> dict:
    started = time.perf_counter()
    result = train(**run_settings(args, family, data, run, steps), progress=False)
    seconds = time.perf_counter() - started
    info = read_data_info(str(data))
    trained = load_trained_model(run, max_predictions_per_seq=info.max_predictions_per_seq)
    params = sum(int(w.size) for w in trained.model.stored_weights().values())
    metrics, examples = held_out_metrics(trained, str(data), 32, 0)  # every eval record
    row = {"steps": result.steps, "seconds": seconds, "seq_per_s": result.examples_per_second,
           "steps_per_s": result.examples_per_second / args.batch, "params": params, "eval": metrics,
           "eval_examples": examples, "probe": None}
    if task:
        row["probe"] = probe(run, task, max_seq_length=min(64, args.max_seq_length))
    return row


def bench_corpus(args, corpus: Path, separator: str, task: str | None, work: Path, data: Path) -> dict:
    """Both families on one corpus (its data folder made): the rows and what they share."""
    flops = {f: flops_per_sequence(run_settings(args, f, data, work / f"run-{f}", 1)) for f in FAMILIES}
    budget = args.bert_steps * args.batch * flops["bert"]
    rows = {}
    for family in FAMILIES:
        steps = max(1, round(budget / (args.batch * flops[family])))
        rows[family] = train_family(args, family, data, work / f"run-{family}", steps, task)
        rows[family]["flops"] = flops[family]
        rows[family]["tflop"] = rows[family]["steps"] * args.batch * flops[family] / 1e12
    return {"corpus": corpus, "separator": separator, "budget": budget, "rows": rows, "task": task,
            "max_predictions": read_data_info(str(data)).max_predictions_per_seq}


def print_table(args, results: list[dict]) -> None:
    print(f"\nJAX backend, modern recipe for both; BERT {args.bert_size} vs ModernBERT {args.modernbert_size}, length "
          f"{args.max_seq_length}, batch {args.batch}, peak learning rate {args.learning_rate}, seed {args.seed}; "
          f"BERT {args.bert_steps} steps and ModernBERT the same training FLOPs; held-out MLM on every eval record "
          "(masked at 0.15)", flush=True)
    print("corpus               family      params  MFLOP/seq  steps  TFLOP  seconds  steps/s  seq/s "
          "| eval loss  acc   | probe: pretrained  random  majority")
    for r in results:
        name = r["corpus"].name + (f":{r['separator']}" if r["separator"] else "")
        for family, row in r["rows"].items():
            e = row["eval"] or {"mlm_loss": float("nan"), "mlm_accuracy": float("nan")}
            p = row["probe"]
            probed = (f"{p.pretrained_accuracy:17.3f} {p.random_accuracy:7.3f} {p.majority_accuracy:9.3f}" if p
                      else "  (no probe task)")
            print(f"{name[:20]:20} {family:10} {row['params'] / 1e6:6.2f}M {row['flops'] / 1e6:10.0f} "
                  f"{row['steps']:6d} {row['tflop']:6.2f} {row['seconds']:8.1f} {row['steps_per_s']:8.2f} "
                  f"{row['seq_per_s']:6.1f} | {e['mlm_loss']:9.3f} {e['mlm_accuracy']:.3f} | {probed}")
    for r in results:
        b, m = (r["rows"][f]["eval"] for f in FAMILIES)
        if b and m:
            print(f"{r['corpus'].name}: modernbert - bert held-out MLM loss {m['mlm_loss'] - b['mlm_loss']:+.3f}, "
                  f"accuracy {m['mlm_accuracy'] - b['mlm_accuracy']:+.3f} ({r['rows']['bert']['eval_examples']} eval "
                  f"sequences, {r['max_predictions']} masked-position slots per sequence)"
                  + (f"; probe task {r['task']}" if r["task"] else ""), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("corpus", nargs="*", help="text corpora, PATH or PATH:SEP (--smoke: the built-in sample)")
    parser.add_argument("--probe_task", nargs="+", default=[],
                        help="a labelled text<TAB>label file per corpus, in order ('-': no probe for that corpus)")
    parser.add_argument("--vocab_size", type=int, default=8000, help="per corpus (zh_fortunes needs 7,062 for its "
                        "characters)")
    parser.add_argument("--bert_size", default="L2-H256")
    parser.add_argument("--modernbert_size", default="L2-H256")
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--bert_steps", type=int, default=160)
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log_every", type=int, default=25, help="steps per timed call and log line")
    parser.add_argument("--dupe_factor", type=int, default=2)
    parser.add_argument("--eval_fraction", type=float, default=0.05)
    parser.add_argument("--work", type=Path, default=None, help="Folder for the data and runs (default: a temp one).")
    args = parse_args(parser, smoke={"vocab_size": 500, "bert_size": "L2-H128", "modernbert_size": "L2-H128",
                                     "max_seq_length": 64, "batch": 4, "bert_steps": 4, "dupe_factor": 1,
                                     "eval_fraction": 0.1},
                      what=f"the built-in sample corpus ({SMOKE_CHARS:,} characters), a 500-token vocab, L2-H128, "
                           "length 64, batch 4, 4 BERT steps")
    if args.probe_task and len(args.probe_task) != max(1, len(args.corpus)):
        parser.error(f"--probe_task takes one file (or '-') per corpus: {len(args.corpus)} corpora, "
                     f"{len(args.probe_task)} tasks")
    logging.basicConfig(level=logging.WARNING)
    work, specs = corpus_specs(parser, args, "bench_families_", SMOKE_CHARS)
    tasks = [None if t == "-" else t for t in args.probe_task] or [None] * len(specs)
    if args.smoke and not args.corpus and not args.probe_task:  # the probe's code path too
        tasks = [smoke_task(specs[0][0], work / "task.tsv")]
    started = time.perf_counter()
    folders = [work / f"{i}-{path.stem}" for i, (path, _) in enumerate(specs)]
    datas = [modern_data(args, path, separator, folder)[1]  # every corpus's data first: a bad one fails early
             for (path, separator), folder in zip(specs, folders, strict=True)]
    results = []
    for (path, separator), task, folder, data in zip(specs, tasks, folders, datas, strict=True):
        results.append(bench_corpus(args, path, separator, task, folder, data))
        print_table(args, results[-1:])  # as each corpus is done, then all together
    if len(results) > 1:
        print_table(args, results)
    where = where_the_work_went(args, work)
    print(f"{time.perf_counter() - started:.0f} s in all; {where}")


if __name__ == "__main__":
    main()
