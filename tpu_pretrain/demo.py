"""``tpu-pretrain demo``: the whole path on the built-in sample corpus, small enough for a laptop CPU."""

from __future__ import annotations

import time
from pathlib import Path

from .config import Config


def run_demo(output_dir: str | Path = "demo_run", workers: int = 0) -> dict:
    """Build the sample corpus, a vocab and the pretraining shards; print where each artefact went."""
    from .pretraining_data import create_pretraining_data
    from .sample_corpus import write_sample_corpus
    from .vocab import build_vocab

    out = Path(output_dir)
    started = time.time()
    corpus = write_sample_corpus(out / "corpus" / "stdlib_docstrings.txt")
    print(f"[1/3] sample corpus: {corpus} ({corpus.stat().st_size / 1e6:.2f} MB of standard-library docstrings)")

    config = Config.load(
        input=[str(corpus)], output_dir=str(out), vocab_size=8000, vocab_file=str(out / "vocab.txt"),
        random_seed=12345, workers=workers,
    )
    vocab = build_vocab(config)
    print(f"[2/3] vocab: {vocab.path} ({vocab.vocab_size} tokens, {vocab.pieces} learnt pieces)")

    config = Config.load(
        input=[str(corpus)], output_dir=str(out / "data"), vocab_file=vocab.path, max_seq_length=128,
        max_predictions_per_seq=20, dupe_factor=2, eval_fraction=0.05, do_whole_word_mask=True, workers=workers,
    )
    manifest = create_pretraining_data(config)
    print(f"[3/3] pretraining data: {out / 'data'}")
    print("      " + manifest.summary().replace("\n", "\n      "))
    print(f"demo finished in {time.time() - started:.1f} s; artefacts under {out.resolve()}")
    return {"corpus": str(corpus), "vocab": vocab.path, "data_dir": str(out / "data"), "manifest": manifest}
