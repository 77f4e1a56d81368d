"""Subcommands on a trained model: evaluate, export, probe."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..config import EVALUATE, Config, step_settings
from ..errors import UserInputError
from .parser import EXIT_OK, command


# -- evaluate and export ---------------------------------------------------------------------------------
def _source_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN", help="Run folder (train's output_dir); export also takes a Hugging "
                        "Face folder or a Google checkpoint, to convert it.")
    parser.add_argument("--checkpoint", help="Weights to use: a step of the run (20000), a checkpoint folder or "
                        "prefix, or a Hugging Face folder (default: the run's newest).")


def _evaluate_arguments(parser: argparse.ArgumentParser) -> None:
    _source_arguments(parser)
    parser.add_argument("--sentence", action="append", default=[], metavar="TEXT",
                        help="A sentence with [MASK] slots to fill (repeatable). [MASK][MASK] without a space asks "
                        "for one word of two WordPieces; a [SEP] starts a second segment.")
    parser.add_argument("--top_k", type=int, default=5, help="Candidates shown per [MASK] slot (default: 5).")
    parser.add_argument("--all", action="store_true", help="Read every eval record (ignore max_eval_steps).")
    parser.add_argument("--output", help="Results file NAME.json, or a folder to write evaluation.json in (any other "
                        "new name is a folder, made) (default: RUN/evaluation.json).")
    parser.add_argument("--blimp", nargs="?", const="hf://datasets/nyu-mll/blimp", metavar="PATH",
                        help="Also score BLiMP's English minimal pairs by pseudo-log-likelihood (accuracy per "
                        "phenomenon, field and overall, in blimp.json beside evaluation.json): PATH is a folder of "
                        "BLiMP's .jsonl files or one file; alone, read from the Hugging Face Hub (needs datasets).")
    parser.add_argument("--blimp_pairs", type=int, metavar="N", help="BLiMP: the first N pairs of each phenomenon "
                        "(default: all 1,000; on a CPU a small model scores a few hundred pairs a second).")
    parser.add_argument("--blimp_random_inits", type=int, default=0, metavar="N", help="BLiMP: also score N random "
                        "initialisations of the model's shape (seeds 0 to N-1; each costs the model's time) and "
                        "report their mean, std and range beside its accuracy, and whether it lies outside them: an "
                        "untrained model lands a few points either side of 0.5 (default: 0; 3 is a good start).")


@command("evaluate", "Held-out MLM loss/accuracy/perplexity and NSP accuracy of a run's newest (or chosen) "
         "weights, fill-mask predictions, curves PNG; results in RUN/evaluation.json.",
         step_settings(EVALUATE), arguments=_evaluate_arguments)
def _evaluate(config: Config, args: argparse.Namespace) -> int:
    from ..export.evaluate import evaluate
    from ..export.plots import plot_run

    trained = blimp = None
    if args.blimp_pairs is not None and args.blimp is None:
        raise UserInputError(f"--blimp_pairs {args.blimp_pairs} counts BLiMP's pairs, and BLiMP is scored only with "
                             "--blimp (PATH, or alone for the Hugging Face Hub): add --blimp, or leave --blimp_pairs "
                             "out.")
    if args.blimp_random_inits and args.blimp is None:
        raise UserInputError(f"--blimp_random_inits {args.blimp_random_inits} scores random inits on BLiMP, which is "
                             "scored only with --blimp (PATH, or alone for the Hugging Face Hub): add --blimp, or "
                             "leave --blimp_random_inits out.")
    if args.blimp is not None:  # the pairs read first: a wrong PATH is said before the slow work
        from ..export import blimp
        from ..export.blimp_results import check_random_inits, evaluate_blimp
        from ..export.rebuild import load_trained_model

        check_random_inits(args.blimp_random_inits)
        pairs = blimp.load_pairs(args.blimp, args.blimp_pairs)
        trained = load_trained_model(args.run, args.checkpoint)
    result = evaluate(args.run, args.checkpoint, sentences=args.sentence, top_k=args.top_k,
                      data_dir=args.data_dir, max_eval_steps=0 if args.all else args.max_eval_steps,
                      eval_batch_size=args.eval_batch_size, output=args.output, trained=trained)
    print(result.summary())
    if blimp is not None:
        beside = Path(result.path).with_name(blimp.BLIMP_FILE) if result.path else None  # beside evaluation.json
        print(evaluate_blimp(trained, pairs, args.blimp, beside, random_inits=args.blimp_random_inits).summary())
    try:
        print(f"  curves: {plot_run(args.run)}")
    except UserInputError as exc:
        print(f"  curves: skipped ({exc})")
    return EXIT_OK


def _export_arguments(parser: argparse.ArgumentParser) -> None:
    from ..export import FORMATS, HEADS

    _source_arguments(parser)
    parser.add_argument("--format", choices=FORMATS, default="hf",
                        help="hf: Hugging Face folder (config.json, model.safetensors, tokenizer files); tf: "
                        "Google's bert_model.ckpt + bert_config.json + vocab.txt (default: hf).")
    parser.add_argument("--output", help="Destination folder (default: RUN/export/FORMAT): new, empty, or an earlier "
                        "export of this tool, which is replaced; anything else is refused, never deleted.")
    parser.add_argument("--heads", choices=HEADS, default="all",
                        help="hf only: all (BertForPreTraining), mlm (BertForMaskedLM) or encoder (BertModel): "
                        "the class that then loads without missing or unused weights (default: all).")


@command("export", "Export a run's model as a Hugging Face folder or a Google TF checkpoint (or convert a "
         "checkpoint between the two).", (), arguments=_export_arguments)
def _export(config: Config, args: argparse.Namespace) -> int:
    from ..export.writers import export

    path = export(args.run, args.format, args.output, checkpoint=args.checkpoint, heads=args.heads)
    print(f"Exported ({args.format}) to {path}")
    return EXIT_OK


def _probe_arguments(parser: argparse.ArgumentParser) -> None:
    from ..export import PROBE_MODES

    parser.add_argument("run", metavar="RUN", help="The run folder (output_dir of train).")
    parser.add_argument("--task", required=True, metavar="FILE", help="Labelled examples, one 'text<TAB>label' a "
                        "line (a few hundred to a few thousand).")
    parser.add_argument("--checkpoint", help="Weights to probe (default: the run's newest).")
    parser.add_argument("--mode", choices=PROBE_MODES, default="features", help="features: a ridge classifier on the "
                        "frozen encoder's mean-pooled states (seconds); finetune: the whole encoder with a linear head "
                        "(default: features).")
    parser.add_argument("--max_seq_length", type=int, default=64, help="Tokens per text (default: 64).")
    parser.add_argument("--test_fraction", type=float, default=0.2, help="Share held out (default: 0.2).")
    parser.add_argument("--epochs", type=int, default=5, help="finetune: passes over the data (default: 5).")
    parser.add_argument("--seed", type=int, default=0, help="Split, random initialisation and training seed.")
    parser.add_argument("--output", help="Results JSON (default: RUN/probe.json).")


@command("probe", "Is the pretrained encoder any good? Held-out accuracy on a small labelled file (text<TAB>label) "
         "next to the same model shape from random initialisation, with the time each took.", (),
         arguments=_probe_arguments)
def _probe(config: Config, args: argparse.Namespace) -> int:
    from ..core.run_folder import RunFolder
    from ..export.probe import probe

    result = probe(args.run, args.task, args.checkpoint, mode=args.mode, max_seq_length=args.max_seq_length,
                   test_fraction=args.test_fraction, epochs=args.epochs, seed=args.seed,
                   output=args.output or RunFolder(args.run).probe_file)
    print(result.summary())
    return EXIT_OK
