"""Subcommands of the pipeline: vocab, create-data, train, status, demo, and the Cloud Storage transfers."""

from __future__ import annotations

import argparse

from ..config import CREATE_DATA, DEMO, STORAGE_CHECK, TRAIN, TRANSFER, VOCAB, Config, step_settings
from .parser import EXIT_FAILED, EXIT_OK, EXIT_STOPPED_EARLY, command


# -- subcommands ---------------------------------------------------------------------------------
def _vocab_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--overwrite", action="store_true",
                        help="Replace OUTPUT_DIR/vocab.txt if it exists (without this, an existing file is never "
                        "overwritten).")


@command("vocab", "Train a WordPiece vocab.txt from a corpus (SentencePiece, converted); it is written to "
         "OUTPUT_DIR/vocab.txt.", step_settings(VOCAB), arguments=_vocab_arguments)
def _vocab(config: Config, args: argparse.Namespace) -> int:
    from ..data.vocab import build_vocab

    result = build_vocab(config, overwrite=args.overwrite)
    print(result.summary())
    return EXIT_OK


@command("create-data", "Turn a corpus into BERT pretraining TFRecord shards + manifest.json.",
         step_settings(CREATE_DATA))
def _create_data(config: Config, args: argparse.Namespace) -> int:
    from ..core.run_folder import RunFolder
    from ..data.create import create_pretraining_data
    from ..errors import UserInputError

    out = config.storage.output_dir
    if out and RunFolder(out).holds_a_run():
        raise UserInputError(f"--output_dir {out} holds a training run: shards would land among its checkpoints and "
                             "replace the vocab.txt its model was trained with. Give create-data a folder of its own "
                             "(then train with --data_dir pointing there); nothing was written.")

    if config.data.runner:
        from ..data.beam_pipeline import run_beam

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
    from ..training import train

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
    from ..core.status import run_status

    print(run_status(args.run))
    return EXIT_OK


@command("demo", "Run the whole path on the built-in sample corpus.", step_settings(DEMO))
def _demo(config: Config, args: argparse.Namespace) -> int:
    from ..demo import run_demo

    run_demo(config.storage.output_dir or "demo_run", workers=config.data.workers)
    return EXIT_OK


# -- storage ---------------------------------------------------------------------------------------
def _src_dest_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("src", metavar="SRC", help="File or folder to copy: a local path or gs://bucket/path.")
    parser.add_argument("dest", metavar="DEST", help="Where it goes: a local path or gs://bucket/path.")


def _transfer(config: Config, args: argparse.Namespace) -> int:
    from ..storage import drive
    from ..storage.transfer import transfer

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
    from ..storage.security import check_storage

    s = config.storage
    report = check_storage(args.url, data_url=s.data_dir or None, run_url=s.output_dir or None)
    print(report.text())
    return EXIT_OK if report.ok else EXIT_FAILED
