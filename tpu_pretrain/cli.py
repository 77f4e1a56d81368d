"""The ``tpu-pretrain`` command line: one subcommand per step, flags named as the configuration fields.

Flags are generated from :mod:`tpu_pretrain.config`, so a flag, a notebook parameter and a Python
keyword argument always share one name, and a subcommand offers exactly the settings tagged with its
step. Booleans accept ``--flag``, ``--flag=false`` (the old absl
style of Google's scripts) and ``--noflag``.

Exit codes (README.md lists them too): 0 done; 1 the command ran but something failed (a transfer,
a storage check); 2 bad input or a refusal (the message says why and what to do); 75 training stopped
early (SIGTERM, Ctrl-C, the session's deadline) and the same command continues it; 130 interrupted.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import logging
import os
import re
import sys
import typing
from collections.abc import Callable, Sequence

from .config import (
    CREATE_DATA,
    DEMO,
    EVALUATE,
    STORAGE_CHECK,
    TRAIN,
    TRANSFER,
    VOCAB,
    Config,
    all_fields,
    field_type,
    step_settings,
)
from .config_checks import parse_bool
from .errors import UserInputError

# Exit codes: see the module docstring (and README.md).
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_STOPPED_EARLY, EXIT_INTERRUPTED = 0, 1, 2, 75, 130
EXIT_CODES = (f"exit codes: {EXIT_OK} done; {EXIT_FAILED} something failed (a transfer, a storage check); "
              f"{EXIT_BAD_INPUT} bad input or refused (the message says why); {EXIT_STOPPED_EARLY} training "
              f"stopped early (signal or session deadline): run the same command to continue; "
              f"{EXIT_INTERRUPTED} interrupted.")
_COMMANDS: dict[str, tuple[str, Sequence[str], Callable[[Config, argparse.Namespace], int]]] = {}
# Extra (e.g. positional) arguments of a subcommand, added by a callback on its parser.
_ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {}


def command(name: str, help_text: str, flags: Sequence[str],
            arguments: Callable[[argparse.ArgumentParser], None] | None = None):
    """Register a subcommand whose function takes the validated Config and the parsed arguments.

    ``arguments``, if given, adds arguments that are not configuration settings (such as SRC DEST).
    """

    def register(func):
        _COMMANDS[name] = (help_text, flags, func)
        if arguments is not None:
            _ARGUMENTS[name] = arguments
        return func

    return register


def add_config_arguments(parser: argparse.ArgumentParser, names: Sequence[str]) -> None:
    fields = all_fields()
    for name in names:
        f = fields[name]
        kind = field_type(name)
        # argparse %-formats help texts: a literal % (doc_separator's example) must be doubled.
        help_text = f"{f.metadata.get('help', '')} (default: {_default_text(f)})".replace("%", "%%")
        if kind is bool:
            parser.add_argument(f"--{name}", nargs="?", const=True, default=None, type=parse_bool,
                                metavar="BOOL", help=help_text)
            parser.add_argument(f"--no{name}", dest=name, action="store_const", const=False,
                                help=argparse.SUPPRESS)
        elif typing.get_origin(kind) is list:
            parser.add_argument(f"--{name}", nargs="+", action="extend", default=None, help=help_text)
        else:
            parser.add_argument(f"--{name}", type=kind, default=None, choices=f.metadata.get("choices"),
                                help=help_text)


def config_from_args(args: argparse.Namespace, names: Sequence[str]) -> Config:
    overrides = {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}
    base = getattr(args, "config", None)
    saved = os.path.join(overrides.get("output_dir", ""), "config.json")
    if base is None and getattr(args, "command", None) == "train" and os.path.isfile(saved):
        base = saved  # an existing run folder continues with its settings; flags override the safe ones
    return Config.load(base, **overrides)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tpu-pretrain",
        description="Pretrain BERT-family masked language models on TPU, GPU or CPU.",
        epilog=EXIT_CODES,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="More log output.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (help_text, flags, _) in _COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text, epilog=EXIT_CODES)
        p.set_defaults(subparser=p)  # for the message about an unknown flag
        p.add_argument("--config", help="JSON or YAML file of settings; flags override it.")
        add_config_arguments(p, flags)
        if name in _ARGUMENTS:
            _ARGUMENTS[name](p)
    return parser


def parse_arguments(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """Parse, reading ``--flag -1e-4`` as a value, and answering an unknown flag with the flag meant."""
    args, unknown = parser.parse_known_args(_negative_values_attached(argv))
    if unknown:
        hint = _flag_hint(args.subparser, args.command, unknown)
        args.subparser.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
    return args


_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)(e[-+]?\d+)?$", re.IGNORECASE)


def _negative_values_attached(argv: Sequence[str]) -> list[str]:
    """``--learning_rate -1e-4`` as ``--learning_rate=-1e-4``: argparse takes ``-1e-4`` for an option."""
    out: list[str] = []
    for token in argv:
        if out and _NUMBER.match(token) and out[-1].startswith("--") and "=" not in out[-1]:
            out[-1] = f"{out[-1]}={token}"
        else:
            out.append(token)
    return out


def _flag_hint(parser: argparse.ArgumentParser, command: str, unknown: Sequence[str]) -> str:
    """A hint for an unknown flag: the flag meant, or the steps that take a setting this step does not."""
    fields = all_fields()
    for token in unknown:
        if not token.startswith("--"):
            continue
        name = token[2:].split("=", 1)[0]
        if name in fields:
            steps = fields[name].metadata["steps"]
            where = f"a setting of {', '.join(steps)}" if steps else "not a command-line setting"
            return f" ({name} is {where}, not of {command})"
        offered = [o for o in parser._option_string_actions if o.startswith("--")]
        close = difflib.get_close_matches(f"--{name}", offered, n=1, cutoff=0.6)
        if close:
            return f" (did you mean {close[0]}?)"
    return ""


def configure_logging(verbose: bool) -> None:
    """Our progress at INFO; other libraries (TensorFlow's save timings, HTTP retries) only when they warn."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING, format="%(message)s")
    logging.getLogger("tpu_pretrain").setLevel(logging.DEBUG if verbose else logging.INFO)
    if not verbose:  # the storage layer reports each failure once, saying what was tried
        for name in ("urllib3", "google", "google_auth_httplib2"):
            logging.getLogger(name).setLevel(logging.ERROR)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parse_arguments(parser, sys.argv[1:] if argv is None else argv)
    configure_logging(args.verbose)
    help_text, flags, func = _COMMANDS[args.command]
    try:
        config = config_from_args(args, flags)
        return int(func(config, args) or 0)
    except UserInputError as exc:
        print(f"tpu-pretrain {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print(f"tpu-pretrain {args.command}: interrupted. What was complete is kept (files are written whole or "
              "not at all); run the same command again to continue.", file=sys.stderr)
        return EXIT_INTERRUPTED


def _default_text(f) -> str:
    if f.default is not dataclasses.MISSING:
        return repr(f.default)
    return repr(f.default_factory())


# -- subcommands ---------------------------------------------------------------------------------
def _vocab_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--overwrite", action="store_true",
                        help="Replace OUTPUT_DIR/vocab.txt if it exists (without this, an existing file is never "
                        "overwritten).")


@command("vocab", "Train a WordPiece vocab.txt from a corpus (SentencePiece, converted); it is written to "
         "OUTPUT_DIR/vocab.txt.", step_settings(VOCAB), arguments=_vocab_arguments)
def _vocab(config: Config, args: argparse.Namespace) -> int:
    from .data.vocab import build_vocab

    result = build_vocab(config, overwrite=args.overwrite)
    print(result.summary())
    return EXIT_OK


@command("create-data", "Turn a corpus into BERT pretraining TFRecord shards + manifest.json.",
         step_settings(CREATE_DATA))
def _create_data(config: Config, args: argparse.Namespace) -> int:
    from .data.create import create_pretraining_data

    if config.data.runner:
        from .data.beam_pipeline import run_beam

        manifest = run_beam(config)
    else:
        manifest = create_pretraining_data(config)
    print(manifest.summary())
    return EXIT_OK


def _train_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--set_aside_damaged_checkpoints", action="store_true",
                        help="When every checkpoint of the run is damaged, move them to checkpoints/damaged/ and "
                        "start from step 0 (without this, train refuses to start and names them).")


@command("train", "Pretrain BERT on the shards of create-data (TPU, GPUs or CPU).", step_settings(TRAIN),
         arguments=_train_arguments)
def _train(config: Config, args: argparse.Namespace) -> int:
    from .train.loop import train

    result = train(config, set_aside_damaged_checkpoints=args.set_aside_damaged_checkpoints)
    print(result.summary())
    if result.stopped_reason:
        print(f"Stopped early ({result.stopped_reason}); run `tpu-pretrain train --output_dir "
              f"{config.storage.output_dir}` to continue (exit code {EXIT_STOPPED_EARLY}: not finished).")
        return EXIT_STOPPED_EARLY
    return EXIT_OK


def _run_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN", help="The run folder (output_dir of train).")


@command("status", "Where a run stands: step, newest checkpoint and mirror, time trained, time left.", (),
         arguments=_run_argument)
def _status(config: Config, args: argparse.Namespace) -> int:
    from .train.status import run_status

    print(run_status(args.run))
    return EXIT_OK


@command("demo", "Run the whole path on the built-in sample corpus.", step_settings(DEMO))
def _demo(config: Config, args: argparse.Namespace) -> int:
    from .demo import run_demo

    run_demo(config.storage.output_dir or "demo_run", workers=config.data.workers)
    return EXIT_OK


# -- storage ---------------------------------------------------------------------------------------
def _src_dest_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("src", metavar="SRC", help="File or folder to copy: a local path or gs://bucket/path.")
    parser.add_argument("dest", metavar="DEST", help="Where it goes: a local path or gs://bucket/path.")


def _transfer(config: Config, args: argparse.Namespace) -> int:
    from .storage import drive
    from .storage.transfer import transfer

    s = config.storage
    for path in (args.src, args.dest):
        drive.ensure_drive_ready(path, mount=s.mount_drive)
    summary = transfer(args.src, args.dest, s.transfer_options(progress=True))
    print(summary.text())
    return EXIT_OK if summary.ok else EXIT_FAILED


@command("upload", "Upload a file or folder to Cloud Storage: parallel, resumable, crc32c-verified; "
         "identical files are skipped, so re-running only sends what is missing.", step_settings(TRANSFER),
         arguments=_src_dest_arguments)
def _upload(config: Config, args: argparse.Namespace) -> int:
    return _transfer(config, args)


@command("download", "Download a file or prefix from Cloud Storage: parallel, crc32c-verified, atomic; "
         "identical files are skipped.", step_settings(TRANSFER), arguments=_src_dest_arguments)
def _download(config: Config, args: argparse.Namespace) -> int:
    return _transfer(config, args)


def _check_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", metavar="gs://BUCKET[/PREFIX]", help="Bucket (and prefix) to check.")


@command("storage-check", "Warn if a bucket is public, verify the credentials can list/read the data "
         "prefix (--data_dir) and write the run prefix (--output_dir), and print least-privilege "
         "gcloud commands.", step_settings(STORAGE_CHECK), arguments=_check_arguments)
def _storage_check(config: Config, args: argparse.Namespace) -> int:
    from .storage.security import check_storage

    s = config.storage
    report = check_storage(args.url, data_url=s.data_dir or None, run_url=s.output_dir or None)
    print(report.text())
    return EXIT_OK if report.ok else EXIT_FAILED


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
    parser.add_argument("--output", help="Results JSON file, or a folder to write evaluation.json in (default: "
                        "RUN/evaluation.json).")


@command("evaluate", "Held-out MLM loss/accuracy/perplexity and NSP accuracy of a run's newest (or chosen) "
         "weights, fill-mask predictions, curves PNG; results in RUN/evaluation.json.",
         step_settings(EVALUATE), arguments=_evaluate_arguments)
def _evaluate(config: Config, args: argparse.Namespace) -> int:
    from .export.evaluate import evaluate
    from .export.plots import plot_run

    result = evaluate(args.run, args.checkpoint, sentences=args.sentence, top_k=args.top_k,
                      data_dir=args.data_dir, max_eval_steps=0 if args.all else args.max_eval_steps,
                      eval_batch_size=args.eval_batch_size, output=args.output)
    print(result.summary())
    try:
        print(f"  curves: {plot_run(args.run)}")
    except UserInputError as exc:
        print(f"  curves: skipped ({exc})")
    return EXIT_OK


def _export_arguments(parser: argparse.ArgumentParser) -> None:
    from .export import FORMATS, HEADS

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
    from .export.writers import export

    path = export(args.run, args.format, args.output, checkpoint=args.checkpoint, heads=args.heads)
    print(f"Exported ({args.format}) to {path}")
    return EXIT_OK
