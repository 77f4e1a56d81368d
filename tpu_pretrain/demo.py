"""``tpu-pretrain demo``: the whole path on the built-in sample corpus, small enough for a laptop CPU.

It trains with the modern recipe (packed, MLM-only sequences), the one for a model from scratch, so that its own
data draws no warning; it needs only the package and one backend (``make demo`` installs JAX alone), and writes
Google's TF checkpoint only where TensorFlow is installed.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

from .config import Config


def run_demo(output_dir: str | Path = "demo_run", workers: int = 0, steps: int = 400) -> dict:
    """Corpus, vocab, shards, a small model trained on CPU, evaluation and exports; prints where each went."""
    from .data.create import create_pretraining_data
    from .data.sample_corpus import write_sample_corpus
    from .data.vocab import build_vocab
    from .export.evaluate import evaluate
    from .export.plots import plot_run
    from .export.writers import export
    from .training import train

    out = Path(output_dir)
    started = time.time()
    corpus = write_sample_corpus(out / "corpus" / "stdlib_docstrings.txt")
    print(f"[1/6] sample corpus: {corpus} ({corpus.stat().st_size / 1e6:.2f} MB of standard-library docstrings)")

    vocab = out / "vocab.txt"
    if vocab.exists():  # an earlier demo's (or yours): kept, never overwritten
        print(f"[2/6] vocab: {vocab} (already there: kept)")
    else:
        built = build_vocab(Config.load(input=[str(corpus)], output_dir=str(out), vocab_size=8000, random_seed=12345))
        print(f"[2/6] vocab: {built.path} ({built.vocab_size} tokens, {built.pieces} learnt pieces)")

    config = Config.load(
        recipe="modern", input=[str(corpus)], output_dir=str(out / "data"), vocab_file=str(vocab),
        max_seq_length=128, dupe_factor=5, eval_fraction=0.1, do_whole_word_mask=True, workers=workers,
    )
    manifest = create_pretraining_data(config)
    print(f"[3/6] pretraining data: {out / 'data'}")
    print("      " + manifest.summary().replace("\n", "\n      "))

    run = out / "run"
    result = train(recipe="modern", data_dir=str(out / "data"), output_dir=str(run), model_size="L2-H128",
                   train_batch_size=32, num_train_steps=steps, num_warmup_steps=steps // 10, learning_rate=2e-3,
                   save_checkpoints_steps=max(steps // 4, 1), eval_every_steps=max(steps // 4, 1),
                   log_every_steps=max(steps // 10, 1), max_eval_steps=10, progress=None)
    print(f"[4/6] trained {result.steps} steps of BERT L2-H128 in {run} (checkpoints in {run / 'checkpoints'})")
    print("      " + result.summary())

    evaluation = evaluate(run, sentences=["The module provides functions for [MASK] with files.",
                                          "Return the [MASK] of the list."], top_k=3)
    print(f"[5/6] evaluation {_eval_counts(evaluation.eval_examples, manifest.totals('eval')['instances'], run)}, "
          f"saved in {evaluation.path}:")
    print("      " + evaluation.summary().replace("\n", "\n      "))
    print("      (a 2-layer model after a few minutes on half a megabyte: its guesses are mostly the commonest words)")
    curves = plot_run(run)
    hf = export(run, "hf")
    if importlib.util.find_spec("tensorflow") is not None:
        tf_ckpt = export(run, "tf")
        tf_line = f"original TF checkpoint export: {tf_ckpt}"
    else:  # Google's checkpoint format is written with TensorFlow, which the demo's environment leaves out
        tf_ckpt = None
        tf_line = ("original TF checkpoint export: skipped (it needs TensorFlow: make install, then "
                   f"tpu-pretrain export {run} --format tf)")
    print(f"[6/6] curves: {curves}; Hugging Face export: {hf}; {tf_line}")
    print(f"demo finished in {time.time() - started:.1f} s; artefacts under {out.resolve()}")
    print(f"Next: your own text, as README's walk-through does it (\"Your own text on a CPU\"){_this_environment()}; "
          f"the export loads in transformers (README's step 6): BertForMaskedLM.from_pretrained({str(hf)!r})")
    return {"corpus": str(corpus), "vocab": str(vocab), "data_dir": str(out / "data"), "manifest": manifest,
            "run": str(run), "train": result, "evaluation": evaluation, "hf": str(hf),
            "tf": str(tf_ckpt) if tf_ckpt else None}


def _eval_counts(read: int, held_out: int, run: Path) -> str:
    """Why the evaluation's count is not the held-out split's: training's evals (and so this one) read
    ``max_eval_steps`` batches, 10 of 32 here; ``--all`` reads them all."""
    if read >= held_out:
        return f"of all {held_out} held-out sequences"
    return (f"of {read} of the {held_out} held-out sequences (the first 10 batches of 32, as training's evals read; "
            f"`tpu-pretrain evaluate {run} --all` reads all {held_out})")


def _this_environment() -> str:
    """Where the walk-through's commands are: this virtual environment's ``tpu-pretrain`` (``.venv-demo``'s after
    ``make demo``), named so that the next step is taken with the same one."""
    if sys.prefix == sys.base_prefix:
        return ""
    activate = Path(sys.prefix) / "bin" / "activate"
    try:
        activate = activate.relative_to(Path.cwd())
    except ValueError:
        pass
    return f", in this environment (source {activate})"
