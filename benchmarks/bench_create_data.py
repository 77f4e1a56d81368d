"""Benchmark ``create-data`` end to end: input MB/s, instances/s and peak memory at several corpus sizes.

Usage: python benchmarks/bench_create_data.py CORPUS VOCAB [--scales 1 4] [--workers 0] [--pack_sequences]
           [--short_documents] [--google [--google_scale 16]] [--whole_word_mask]
       python benchmarks/bench_create_data.py --smoke   (the built-in sample corpus, 60k characters, x1 and x2)

Each size runs ``tpu-pretrain create-data`` (max_seq_length 128, 20 predictions, dupe_factor 10: the defaults of
both tools; NSP pairs unless packed) in a fresh process tree whose summed RSS is sampled every 20 ms, and reports MB/s,
instances/s and the fill (real tokens / (instances x 128)): MB/s alone hides how many instances, and how
much padding, a corpus makes. Two baselines, measured in the same run on the first size: Hugging Face
``tokenizers`` alone tokenising the same text on all cores (the floor any pipeline built on it pays), and
with ``--google`` Google's own ``create_pretraining_data.py`` (the ``bert-tensorflow`` 1.0.4 release from
PyPI, installed into ``~/.cache`` on first use; it has no whole-word masking, so neither side masks whole
words unless ``--whole_word_mask``) on the same corpus, vocab and settings, at the first size or
``--google_scale``. ``--short_documents`` first cuts
the corpus into documents of 1-3 sentences (split at " . ", a fixed seed), the case where many small,
mostly padded instances make the per-instance work dominate. Peak memory grows with shard size until
shards exceed one block of work (2M characters), then stays flat however large the corpus.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from support import parse_args  # noqa: E402

SMOKE_CHARS = 60_000  # of the built-in sample corpus
GOOGLE_RELEASE = "bert-tensorflow==1.0.4"  # google-research/bert as released on PyPI (create_pretraining_data.py)
SETTINGS = {"max_seq_length": 128, "max_predictions_per_seq": 20, "masked_lm_prob": 0.15}  # both tools' defaults


def smoke_inputs(folder: Path) -> tuple[Path, str]:
    """The built-in sample corpus (no download) and a small vocab built from it."""
    import tpu_pretrain  # noqa: F401  (environment first)
    from tpu_pretrain.config import Config
    from tpu_pretrain.data.sample_corpus import write_sample_corpus
    from tpu_pretrain.data.vocab import build_vocab

    corpus = write_sample_corpus(folder / "sample.txt", max_chars=SMOKE_CHARS)
    vocab = build_vocab(Config.load(input=[str(corpus)], vocab_size=500, output_dir=str(folder)))
    return corpus, vocab.path


def tree_rss(process: psutil.Process) -> int:
    total = 0
    for p in [process] + process.children(recursive=True):
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def watched_run(args: list[str], what: str) -> tuple[float, int]:
    """Seconds and peak summed RSS of a command's whole process tree (sampled every 20 ms)."""
    start = time.perf_counter()
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    watched = psutil.Process(process.pid)
    peak = [0]

    def sample():
        while process.poll() is None:
            try:
                peak[0] = max(peak[0], tree_rss(watched))
            except psutil.NoSuchProcess:
                return
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, stderr = process.communicate()
    seconds = time.perf_counter() - start
    sampler.join()
    if process.returncode:
        raise SystemExit(f"{what} failed:\n{stderr.decode()[-4000:]}")
    return seconds, peak[0]


def flags(settings: dict) -> list[str]:
    return [f"--{name}={value}" for name, value in settings.items()]


def run_create_data(corpus: Path, vocab: str, out: Path, workers: int, pack: bool, whole_word: bool,
                    settings: dict) -> tuple[float, int, dict]:
    args = [sys.executable, "-m", "tpu_pretrain", "create-data", "--input", str(corpus), "--vocab_file", vocab,
            "--output_dir", str(out), *flags(settings), f"--do_whole_word_mask={whole_word}",
            "--workers", str(workers), f"--pack_sequences={pack}"]
    seconds, peak = watched_run(args, "create-data")
    return seconds, peak, json.loads((out / "manifest.json").read_text())


def google_release() -> Path:
    """A folder holding Google's ``bert`` package (installed there from PyPI on first use)."""
    folder = Path.home() / ".cache" / "tpu_pretrain" / GOOGLE_RELEASE.replace("==", "-")
    if not (folder / "bert" / "create_pretraining_data.py").is_file():
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(folder),
                        GOOGLE_RELEASE], check=True)
    return folder


def run_google(corpus: Path, vocab: str, out: Path, whole_word: bool, settings: dict) -> tuple[float, int, int]:
    """Seconds, peak RSS and instances of Google's script on the same corpus and settings (one process)."""
    if whole_word:
        raise SystemExit(f"{GOOGLE_RELEASE} has no whole-word masking: leave out --whole_word_mask with --google")
    out.mkdir(parents=True, exist_ok=True)
    script = ("import sys, runpy; sys.path.insert(0, sys.argv.pop(1)); "
              "runpy.run_module('bert.create_pretraining_data', run_name='__main__', alter_sys=True)")
    args = [sys.executable, "-c", script, str(google_release()), f"--input_file={corpus}",
            f"--output_file={out / 'google.tfrecord'}", f"--vocab_file={vocab}", "--do_lower_case=True",
            *flags(settings)]
    seconds, peak = watched_run(args, "Google's create_pretraining_data.py")
    from tpu_pretrain.data.tfrecord import read_records

    return seconds, peak, sum(1 for _ in read_records(out / "google.tfrecord"))


def short_documents(text: str) -> str:
    """The corpus cut into documents of 1-3 sentences (split at " . "), a blank line after each."""
    rng = random.Random(0)
    sentences = [s.strip() + " ." for line in text.splitlines() for s in line.split(" . ") if len(s.strip()) > 1]
    docs, i = [], 0
    while i < len(sentences):
        take = rng.randint(1, 3)
        docs.append("\n".join(sentences[i:i + take]))
        i += take
    return "\n\n".join(docs) + "\n"


def tokenizer_only(corpus: Path, vocab: str) -> float:
    """MB/s of the fast tokenizer alone over the same lines (batched, all cores)."""
    import tpu_pretrain  # noqa: F401  (environment first)
    from tpu_pretrain.data.tokenization import load_tokenizer

    tokenizer = load_tokenizer(vocab)
    lines = corpus.read_text(encoding="utf-8").splitlines()
    start = time.perf_counter()
    for i in range(0, len(lines), 10000):
        tokenizer.backend.encode_batch_fast(lines[i:i + 10000], add_special_tokens=False)
    return corpus.stat().st_size / 1e6 / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("corpus", type=Path, nargs="?", help="a text corpus (--smoke: the built-in sample)")
    parser.add_argument("vocab", nargs="?", help="its vocab.txt (--smoke: one built from the sample)")
    parser.add_argument("--scales", type=int, nargs="+", default=[2, 16, 64], help="corpus copies per run")
    parser.add_argument("--workers", type=int, default=0, help="0: all cores")
    parser.add_argument("--pack_sequences", action="store_true", help="packed sequences (RoBERTa full sentences)")
    parser.add_argument("--whole_word_mask", action="store_true", help="mask whole words (not with --google)")
    parser.add_argument("--short_documents", action="store_true", help="cut the corpus into 1-3 sentence documents")
    parser.add_argument("--dupe_factor", type=int, default=10, help="passes over the corpus (both tools' default)")
    parser.add_argument("--google", action="store_true",
                        help=f"also run Google's create_pretraining_data.py ({GOOGLE_RELEASE}) on one size")
    parser.add_argument("--google_scale", type=int,
                        help="the size Google's script runs on (default: the first); the largest compares equal "
                        "sizes (each tool's start-up weighs least), at minutes and GBs for Google")
    args = parse_args(parser, smoke={"scales": [1, 2], "dupe_factor": 5},
                      what=f"the built-in sample corpus ({SMOKE_CHARS:,} characters) x1 and x2, a 500-token vocab")
    with tempfile.TemporaryDirectory() as tmp:
        if args.smoke and args.corpus is None:
            args.corpus, args.vocab = smoke_inputs(Path(tmp))
        elif args.corpus is None or args.vocab is None:
            parser.error("give CORPUS and VOCAB (or --smoke)")
        google_scale = args.google_scale or args.scales[0]
        if google_scale not in args.scales:
            parser.error(f"--google_scale {google_scale} is not one of --scales {args.scales}")
        settings = {**SETTINGS, "dupe_factor": args.dupe_factor}
        text = args.corpus.read_text(encoding="utf-8")
        text = short_documents(text) if args.short_documents else text if text.endswith("\n") else text + "\n"
        docs = len(re.findall(r"\n[ \t]*\n(?=[^\n])", text)) + 1  # blank (or whitespace) lines end documents
        print(f"machine: {os.cpu_count()} cores; corpus {args.corpus} ({len(text.encode()) / 1e6:.2f} MB, "
              f"{docs} documents of {len(text) / docs:.0f} characters on average"
              f"{', cut into 1-3 sentences' if args.short_documents else ''}); settings {settings}, "
              f"whole-word masking {args.whole_word_mask}")
        results = []
        for scale in args.scales:
            corpus = Path(tmp) / f"corpus_x{scale}.txt"
            corpus.write_text("\n".join([text] * scale), encoding="utf-8")
            size_mb = corpus.stat().st_size / 1e6
            seconds, peak, manifest = run_create_data(corpus, args.vocab, Path(tmp) / f"out_x{scale}", args.workers,
                                                      args.pack_sequences, args.whole_word_mask, settings)
            instances = sum(s["instances"] for s in manifest["shards"])
            fill = manifest["totals"]["train"]["fill"]
            results.append((scale, size_mb, seconds, instances, peak))
            print(f"x{scale}: {size_mb:7.2f} MB in {seconds:6.2f} s -> {size_mb / seconds:5.2f} MB/s, "
                  f"{instances / seconds:8.0f} instances/s ({instances} instances, fill {fill:.2f}), "
                  f"peak RSS {peak / 2**20:6.0f} MiB (all processes)")
        first_corpus = Path(tmp) / f"corpus_x{args.scales[0]}.txt"
        baseline = tokenizer_only(first_corpus, args.vocab)
        google = run_google(Path(tmp) / f"corpus_x{google_scale}.txt", args.vocab, Path(tmp) / "google",
                            args.whole_word_mask, settings) if args.google else None
    best = max(r[1] / r[2] for r in results)
    print(f"baseline, same run: tokenizers alone {baseline:.2f} MB/s; create-data end to end / tokenizer alone = "
          f"{best / baseline:.2f}x")
    if google is not None:
        scale, size_mb, seconds, _, _ = results[args.scales.index(google_scale)]
        g_seconds, g_peak, g_instances = google
        print(f"Google's create_pretraining_data.py, same run, x{scale}: {size_mb / g_seconds:.3f} MB/s, "
              f"{g_instances / g_seconds:.0f} instances/s ({g_instances} instances), "
              f"peak RSS {g_peak / 2**20:.0f} MiB; "
              f"create-data is {g_seconds / seconds:.1f}x faster on the same text (x{scale}), "
              f"{best / (size_mb / g_seconds):.1f}x at its best size")
    first, last = results[-2] if len(results) > 1 else results[0], results[-1]
    print(f"goal: >= 2 MB/s end to end, peak < 1.5 GB and flat once shards exceed one block: peak "
          f"x{last[0]} / x{first[0]} = {last[4] / max(first[4], 1):.2f} for {last[1] / first[1]:.0f}x the text")


if __name__ == "__main__":
    main()
