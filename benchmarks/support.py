"""What the benchmarks share: random BERT-schema data folders (:mod:`tpu_pretrain.data.random_data`), and smoke mode.

Not a benchmark itself (``tests/test_benchmarks.py`` runs every ``bench_*.py``). Imports neither TensorFlow nor
JAX, so the JAX-only benchmark can use it on an image without TensorFlow.
"""

from __future__ import annotations

import argparse

from tpu_pretrain.data.random_data import random_batch, write_random_data_folder

__all__ = ["parse_args", "random_batch", "write_random_data_folder"]

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
