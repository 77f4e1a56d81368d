"""What the benchmarks share: random BERT-schema data folders (:mod:`tpu_pretrain.data.random_data`), smoke mode,
the corpora a benchmark trains on and its work folder.

Not a benchmark itself (``tests/test_benchmarks.py`` runs every ``bench_*.py``). Imports neither TensorFlow nor
JAX, so the JAX-only benchmark can use it on an image without TensorFlow.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from tpu_pretrain.config import Config
from tpu_pretrain.data.create import create_pretraining_data
from tpu_pretrain.data.random_data import random_batch, write_random_data_folder
from tpu_pretrain.data.sample_corpus import write_sample_corpus
from tpu_pretrain.data.vocab import build_vocab

__all__ = ["corpus_spec", "corpus_specs", "kernel_time", "kernel_tiles", "modern_data", "parse_args", "random_batch",
           "where_the_work_went", "write_random_data_folder"]

SMOKE_NOTE = ("smoke mode ({}): this proves the benchmark runs end to end; its figures are meaningless "
              "(run it without --smoke to measure)")


def parse_args(parser: argparse.ArgumentParser, smoke: dict, what: str,
               argv: list[str] | None = None) -> argparse.Namespace:
    """``parser``'s arguments plus ``--smoke``, which swaps the defaults for ``smoke`` (flags given still win) and
    says so, with ``what`` the smoke run is; positional arguments must be optional (checked after this)."""
    parser.add_argument("--smoke", action="store_true",
                        help="a seconds-long run of the same code path on tiny inputs (a tiny model, a few steps, "
                             "tiny data), for CI: its figures are meaningless")
    known, _ = parser.parse_known_args(argv)
    if known.smoke:
        parser.set_defaults(**smoke)
    args = parser.parse_args(argv)
    if args.smoke:
        print(SMOKE_NOTE.format(what), flush=True)
    return args


def corpus_spec(text: str) -> tuple[Path, str]:
    """``PATH`` or ``PATH:SEP`` -> (path, document separator); a path that exists as given is never split."""
    if Path(text).exists() or ":" not in text:
        return Path(text), ""
    path, separator = text.rsplit(":", 1)
    return Path(path), separator


def where_the_work_went(args: argparse.Namespace, work: Path) -> str:
    """A smoke run's throw-away folder removed (nothing left behind); otherwise where the data and runs are."""
    if args.smoke and not args.work:
        shutil.rmtree(work, ignore_errors=True)
        return "data and runs removed (smoke mode)"
    return f"data and runs in {work}"


def corpus_specs(parser: argparse.ArgumentParser, args: argparse.Namespace, prefix: str,
                 smoke_chars: int) -> tuple[Path, list[tuple[Path, str]]]:
    """The work folder (``--work``, else a temporary one) and the corpora (``PATH[:SEP]`` each; none in smoke mode:
    the built-in sample corpus, ``smoke_chars`` long), each checked to exist."""
    if not args.corpus and not args.smoke:
        parser.error("give at least one CORPUS (or --smoke)")
    work = args.work or Path(tempfile.mkdtemp(prefix=prefix))
    work.mkdir(parents=True, exist_ok=True)
    specs = [corpus_spec(c) for c in args.corpus] or [(write_sample_corpus(work / "sample.txt", max_chars=smoke_chars),
                                                        "")]
    for path, _ in specs:
        if not path.is_file():
            parser.error(f"corpus {path} does not exist")
    return work, specs


def modern_data(args, corpus: Path, separator: str, work: Path) -> tuple[str, Path]:
    """One vocab and one ``create-data --recipe modern`` folder: (vocab path, data folder)."""
    vocab = build_vocab(Config.load(input=[str(corpus)], doc_separator=separator, vocab_size=args.vocab_size,
                                    output_dir=str(work)))
    data = work / "data"
    create_pretraining_data(Config.load(
        input=[str(corpus)], doc_separator=separator, vocab_file=vocab.path, output_dir=str(data), recipe="modern",
        max_seq_length=args.max_seq_length, dupe_factor=args.dupe_factor, eval_fraction=args.eval_fraction,
        do_whole_word_mask=True, workers=1))
    return vocab.path, data


def kernel_time(call, arguments: tuple, iterations: int) -> tuple[float, float]:
    """(seconds to compile and run once, milliseconds per call) of ``jax.jit(call)(*arguments)``: the calls are
    dispatched back to back and waited for once, so the figure is the device's, not the host's (a kernel's
    benchmark; JAX is imported here, not by the benchmarks that need none)."""
    import jax

    jitted = jax.jit(call)
    start = time.perf_counter()
    jax.block_until_ready(jitted(*arguments))
    first = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(iterations):
        result = jitted(*arguments)
    jax.block_until_ready(result)
    return first, (time.perf_counter() - start) / iterations * 1e3


def kernel_tiles(variable: str, default: tuple[int, ...]) -> tuple[int, ...]:
    """A candidate kernel's tile shape: ``default``, or the environment's ``variable`` (integers joined by commas, as
    many as ``default`` has), which ``gpu_session.sh probe`` sets to the shape fastest alone before timing the step."""
    text = os.environ.get(variable, "").strip()
    if not text:
        return default
    tiles = tuple(int(n) for n in text.split(","))
    if len(tiles) != len(default):
        raise ValueError(f"{variable}={text!r}: {len(default)} integers joined by commas, as {default}")
    return tiles
